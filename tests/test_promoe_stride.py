"""promoe-style's stride guess for one token (plain Python over whole counts) against the
definition: the token's rows of the transition table summed, divided by their total, read as
float32 and ranked by :func:`top_experts` (ties by expert id), each share over the distance."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.baselines.promoe import StridePrefetcher
from moesim.policies.parts.predictors import top_experts


class _View:
    """Only what after_layer reads besides the outcome: no lookahead (no l + 1 guess)."""

    num_layers = 5

    def lookahead_probs(self, layer: int) -> None:
        return None


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([2, 3, 8]), st.integers(1, 3), st.integers(2, 4), st.booleans())
def test_one_token_guess_is_the_float32_top_k(data: st.DataObject, n_exp: int, k: int, stride: int,
                                               big: bool) -> None:
    pf = StridePrefetcher(stride)
    pf.setup(SimpleNamespace(top_k=k, num_layers=5, num_experts=n_exp, profile=None))   # type: ignore[arg-type]
    scale = float(2 ** 22) if big else 1.0   # big: totals past 2**23, where float32 shares can tie
    counts = st.sampled_from([0, 0, 1, 2, 3, 7])
    for by_dist in pf._trans:
        for table in by_dist:
            if table is not None:
                for row in table:
                    row[:] = [data.draw(counts) * scale for _ in row]
    layer = data.draw(st.integers(0, 4))
    routed = data.draw(st.lists(st.integers(-1, n_exp - 1), min_size=k, max_size=k))
    calls: list[tuple[int, list[tuple[int, float]]]] = []
    pf.prefetch_set = lambda view, t, out: calls.append((t, out)) or 0   # type: ignore[method-assign]
    outcome = SimpleNamespace(routing=SimpleNamespace(experts=np.array([routed])))
    pf.after_layer(_View(), layer, outcome)   # type: ignore[arg-type]
    expected = []
    for t in range(layer + 2, min(5, layer + 1 + stride)):
        table = np.array(pf._trans[layer][t - layer])
        sc = sum((table[a] for a in routed if a >= 0), np.zeros(n_exp))
        if sc.sum() == 0:
            continue
        guess = [(e, p) for e, p in top_experts((sc / sc.sum())[None], k) if p > 0]
        expected.append((t, [(e, float(p) / (t - layer)) for e, p in guess]))
    assert calls == expected
