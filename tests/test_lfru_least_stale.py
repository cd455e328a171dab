"""``lfru`` (vLLM PR #37190) and ``least-stale`` (SpecMD, rule assumed): exact victims on
hand-made traces where each differs from LRU, and the path each run takes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from moesim.policies.baselines.caching import LRU
from moesim.policies.baselines.least_stale import LeastStale
from moesim.policies.baselines.lfru import LFRU
from moesim.policies.contract.base import UnitKey, View
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model


def _recording(cls: type) -> Any:
    class Recording(cls):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.evicted: list[UnitKey] = []

        def on_evict(self, view: View, unit: UnitKey) -> None:
            self.evicted.append(unit)
            super().on_evict(view, unit)
    return Recording()


# one layer, top-2, three slots. After passes {1,2} and {1,3} the cache holds (freq, last):
# 1: (2, 3), 2: (1, 2), 3: (1, 4), clock 4. Pass {5, 2} (5 routed first): vLLM takes 2 first
# (a hit: clock 5), then 5 misses at clock 5: 1 scores 2/3, 3 scores 1/2 -> 3 goes. At the pass's
# starting clock 4 both would score 1 (a tie: 1, inserted first, would go), and LRU evicts 1.
# Pass {1, 3}: 1 hits (clock 7), 3 misses: 2 scores 2/3, 5 scores 1/2 -> 5 goes.
LFRU_TRACE = [[[1, 2]], [[1, 3]], [[5, 2]], [[1, 3]]]


def test_lfru_victims_are_vllms() -> None:
    tr = make_trace(LFRU_TRACE, num_experts=6)
    pol = _recording(LFRU)
    eng, m = run_engine(tr, pol, tiny_model(1, 6, 2), tiny_hw(), budget_experts=3)
    assert pol.evicted == [(0, 3, 0), (0, 5, 0)]
    assert [s.hits for s in steps(eng)] == [0, 1, 1, 1]
    assert sorted(eng.state.vram.units) == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]
    lru = _recording(LRU)
    run_engine(tr, lru, tiny_model(1, 6, 2), tiny_hw(), budget_experts=3)
    assert lru.evicted == [(0, 1, 0), (0, 5, 0)]


def test_lfru_forgets_frequency_on_eviction_and_keeps_a_frequent_expert() -> None:
    # top-1, two slots: A A A B C A. At C, A scores 3 / 2, B 1 / 1: B goes (LRU drops A), so the
    # last A hits; then D: A (4 uses) stays, C goes; C comes back with frequency 1, not 2
    tr = make_trace([[[0]], [[0]], [[0]], [[1]], [[2]], [[0]], [[3]], [[2]]], num_experts=4)
    pol = _recording(LFRU)
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    assert pol.evicted == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]
    assert m["hits"] == 3
    assert pol.cache._entry[(0, 2, 0)][0] == 1
    lru = _recording(LRU)
    _, ml = run_engine(tr, lru, tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    assert ml["hits"] == 2


def test_lfru_takes_the_fast_path() -> None:
    tr = make_trace(LFRU_TRACE, num_experts=6)
    eng, _ = run_engine(tr, LFRU(), tiny_model(1, 6, 2), tiny_hw(), budget_experts=3)
    assert eng.state.path == "fast", eng.state.path_reason   # the generic replay (tests/test_fastpath.py checks it)


# three layers, top-1, one pool of four experts for all layers. Token 1 loads expert 0 of each
# layer; token 2 loads expert 1 of layer 0 into the fourth slot, hits layer 1 and misses expert
# 1 of layer 2. There, layer 2's expert 0 (the current layer's: its next turn is a whole token
# away) goes under Least-Stale, while LRU drops layer 0's expert 0 (used longest ago), which
# token 3 needs at once.
STALE_TRACE = [[[0], [0], [0]], [[1], [0], [1]], [[0], [0], [1]]]


def test_least_stale_evicts_the_expert_whose_layer_runs_again_last() -> None:
    tr = make_trace(STALE_TRACE, num_experts=4)
    pol = _recording(LeastStale)
    eng, m = run_engine(tr, pol, tiny_model(3, 4, 1), tiny_hw(), budget_experts=4)
    assert pol.evicted == [(2, 0, 0)]
    assert [(s.hits, s.misses) for s in steps(eng)] == [(0, 1)] * 3 + [(0, 1), (1, 0), (0, 1)] + [(1, 0)] * 3
    lru = _recording(LRU)
    lru.scope = "global"
    eng_l, _ = run_engine(tr, lru, tiny_model(3, 4, 1), tiny_hw(), budget_experts=4)
    assert lru.evicted == [(0, 0, 0), (2, 0, 0)]
    assert [s.hits for s in steps(eng_l)][6:] == [0, 1, 1]


def test_least_stale_distance_and_ties() -> None:
    from moesim.policies.parts.least_stale import LeastStaleCache

    d = LeastStaleCache.distance
    assert [d(m, 1, 4) for m in range(4)] == [2, 3, 0, 1]   # at layer 1: layer 2 is next, 1 itself last
    # at the same distance the least recently used goes: two experts of layer 1 seen from layer 1
    tr = make_trace([[[0, 1], [0, 1]], [[2, 3], [0, 2]]], num_experts=4)
    pol = _recording(LeastStale)
    run_engine(tr, pol, tiny_model(2, 4, 2), tiny_hw(), budget_experts=4)
    # token 2, layer 0 needs 2 and 3: both layer-0 experts (0, 1) are farthest (layer 0 runs last
    # again) and go first; then layer 1 needs 2: layer 1's expert 1 goes (0 is routed)
    assert pol.evicted == [(0, 0, 0), (0, 1, 0), (1, 1, 0)]


def test_least_stale_takes_the_generic_fast_replay() -> None:
    """One global pool is no reason for the event loop: the generic demand-only replay keeps it
    (tests/test_fastpath.py checks it equals the event loop); the kernels do not take it."""
    eng, _ = run_engine(make_trace(STALE_TRACE, num_experts=4), LeastStale(), tiny_model(3, 4, 1), tiny_hw(),
                        budget_experts=4)
    assert eng.state.path == "fast" and eng.state.path_reason == ""


@given(st.data())
def test_least_stale_victim_is_the_greatest_of_its_defining_key(data: Any) -> None:
    # the one-pass victim equals max(candidates, key=(distance, -last use, -layer, -expert, -part))
    from types import SimpleNamespace

    from moesim.policies.parts.least_stale import LeastStaleCache

    n = data.draw(st.integers(1, 6))
    units = st.tuples(st.integers(0, n - 1), st.integers(0, 4), st.integers(0, 1))
    cands = data.draw(st.lists(units, min_size=1, max_size=12, unique=True))
    rule = LeastStaleCache()
    for key in data.draw(st.lists(st.sampled_from(cands), max_size=20)):
        rule.refresh(key)
    view = SimpleNamespace(num_layers=n, layer=data.draw(st.integers(-1, n)))
    cur = view.layer if 0 <= view.layer < n else n - 1
    want = max(cands, key=lambda k: (LeastStaleCache.distance(k[0], cur, n), -rule.last_used(k), -k[0], -k[1], -k[2]))
    assert rule.victim(view, None, cands) == want   # type: ignore[arg-type]
