"""MoEpic's statistics recorder (:class:`SplitStats`) against a plain count: every token's
activations by cache rank (H), by predicted position (P) and each predicted position's cache
rank (PH), over one-token and several-token iterations, lists and arrays, reads in between."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.moepic.configurator import SplitStats


@st.composite
def records(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[list[int]], list[int], list[list[int]] | None]]]:
    """A layer count, expert count and a list of ``(layer, experts, cache order, predicted orders)``."""
    n_exp = draw(st.sampled_from([3, 8, 20]))
    perm = st.permutations(list(range(n_exp)))
    out = []
    for _ in range(draw(st.integers(1, 30))):
        n = draw(st.integers(1, 3))
        experts = [draw(st.lists(st.integers(-1, n_exp - 1), min_size=1, max_size=3)) for _ in range(n)]
        pred = draw(st.none() | st.lists(perm, min_size=n, max_size=n))
        out.append((draw(st.integers(0, 1)), experts, draw(perm), pred))
    return n_exp, out


@settings(max_examples=60, deadline=None)
@given(records())
def test_split_stats_match_a_plain_count(recs: tuple[int, list]) -> None:
    n_exp, recorded = recs
    rank_hist = np.zeros((2, n_exp), dtype=np.int64)
    pred_act = np.zeros((2, n_exp), dtype=np.int64)
    pred_rank = np.zeros((2, n_exp, n_exp), dtype=np.int64)
    stats = SplitStats(2, n_exp)
    for i, (layer, experts, cache_order, pred) in enumerate(recorded):
        stats.record(layer, np.array(experts) if len({len(r) for r in experts}) == 1 and i % 2 else experts,
                     cache_order, pred)
        rank = {e: r for r, e in enumerate(cache_order)}
        for t, row in enumerate(experts):
            # one token: an expert named twice counts once; several: every activation counts
            for e in (set(row) if len(experts) == 1 else row):
                if e >= 0:
                    rank_hist[layer, rank[e]] += 1
            if pred is not None:
                for y, e in enumerate(pred[t]):
                    pred_rank[layer, y, rank[e]] += 1
                for y in {pred[t].index(e) for e in row if e >= 0}:
                    pred_act[layer, y] += 1
        if i % 7 == 3:   # a read in between changes no count
            stats.layer(layer)
    assert stats.rank_hist.tolist() == rank_hist.tolist()
    assert stats.pred_act.tolist() == pred_act.tolist()
    assert stats.pred_rank.tolist() == pred_rank.tolist()
