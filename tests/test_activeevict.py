"""ActiveEvict (policies/activeevict/policy.py and its parts): the spec sheet's hand-checkable cases
(``activeevict.md`` section 8), the exact swap-out timeline, composition and its baselines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.activeevict.budget_topk import BudgetTopKPlanner
from moesim.policies.activeevict.importance import (
    ImportanceScorer,
    descending,
    redundancy_of,
    release_plan,
    release_target,
)
from moesim.policies.activeevict.policy import ActiveEvict
from moesim.policies.activeevict.pre_eviction import PreEvictor
from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.base import RESIDENT, UnitKey
from moesim.policies.contract.registry import PolicyError, make_policy
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from tests.util import make_trace, random_trace, run_engine, steps, tiny_hw, tiny_model


class FakeView:
    """Just enough of a view for the parts' arithmetic: residents of each layer, evictions."""

    def __init__(self, residents: dict[int, list[int]]) -> None:
        self.units = {layer: [(layer, e, 0) for e in es] for layer, es in residents.items()}
        self.evicted: list[UnitKey] = []

    def units_of_layer(self, layer: int) -> list[UnitKey]:
        return list(self.units.get(layer, []))

    def state(self, layer: int, expert: int, part: int = 0) -> int:
        return RESIDENT

    def pinned(self, layer: int, expert: int) -> bool:
        return False

    def evict(self, layer: int, expert: int, part: int = 0) -> bool:
        self.units[layer].remove((layer, expert, part))
        self.evicted.append((layer, expert, part))
        return True


def _test1_scorer() -> ImportanceScorer:
    sc = ImportanceScorer(alpha=0.5, gamma=0.5, window=4, score="combined")
    sc.setup(1, 4)
    for it, executed in enumerate([{0, 1}, {0, 2}, {0, 1}, {1, 2}]):
        sc.observe(it, 0, executed)
    return sc


P_HAT = np.array([0.05, 0.45, 0.22, 0.28])


def test_spec1_usage_hotness_and_score() -> None:
    sc = _test1_scorer()
    np.testing.assert_allclose(sc.usage(0), [0.875, 1.625, 1.25, 0.0])
    h = sc.hotness(0, [0, 1, 2])
    np.testing.assert_allclose([h[0], h[1], h[2]], [0.875 / 3.75, 1.625 / 3.75, 1.25 / 3.75])
    s = sc.scores(0, [0, 1, 2], P_HAT)
    np.testing.assert_allclose([s[0], s[1], s[2]], [0.141667, 0.441667, 0.276667], atol=1e-6)


@pytest.mark.parametrize("redundancy", ["literal", "run"])
def test_spec1_release_target(redundancy: str) -> None:
    # predicted top-2 {1, 3}, one resident; r = 1 (0.28 - 0.22 < 0.1; 0.22 - 0.05 is not)
    assert release_target(P_HAT, {0, 1, 2}, [1, 3], tau=0.1, r_max=2, redundancy=redundancy) == 2
    assert release_target(P_HAT, {0, 1, 2}, [1, 3], tau=0.1, r_max=0) == 1
    # A6 variant: |{1, 3, 2} \ C| = 1
    assert release_target(P_HAT, {0, 1, 2}, [1, 3], tau=0.1, r_max=2, boundary="nonresident") == 1


def test_redundancy_run_stops_at_the_first_steep_gap() -> None:
    p = np.array([0.5, 0.4, 0.05, 0.03, 0.02])   # gaps below rank 1: .1, .35, .02, .01
    assert release_target(p, set(), [0], tau=0.2, r_max=3, redundancy="literal") == 1 + 2
    assert release_target(p, set(), [0], tau=0.2, r_max=3, redundancy="run") == 1 + 1


def _preevictor(boundary: str = "literal") -> tuple[PreEvictor, ImportanceScorer]:
    sc = _test1_scorer()
    pe = PreEvictor(sc, tau=0.1, r_max=2, boundary=boundary)
    pe._slots = [3]
    pe._mine = [set()]
    pe.evictions = pe.fired = 0
    return pe, sc


def test_spec1_preevicts_e0_then_e2_never_a_predicted_top_k() -> None:
    pe, _ = _preevictor()
    view = FakeView({0: [0, 1, 2]})
    assert pe.preevict(view, 0, P_HAT, [1, 3]) == 2   # type: ignore[arg-type]
    assert view.evicted == [(0, 0, 0), (0, 2, 0)]
    assert view.units_of_layer(0) == [(0, 1, 0)]


def test_spec1b_nonresident_boundary_evicts_only_e0() -> None:
    pe, _ = _preevictor("nonresident")
    view = FakeView({0: [0, 1, 2]})
    assert pe.preevict(view, 0, P_HAT, [1, 3]) == 1   # type: ignore[arg-type]
    assert view.evicted == [(0, 0, 0)]


def test_nonresident_boundary_keeps_the_boundary_experts_it_counted() -> None:
    # executed, oldest first: {0,1} {1,2} {1,2} {1,2}: e0 is the least used resident
    sc = ImportanceScorer(alpha=0.5, gamma=0.5, window=4, score="combined")
    sc.setup(1, 4)
    for it, executed in enumerate([{0, 1}, {1, 2}, {1, 2}, {1, 2}]):
        sc.observe(it, 0, executed)
    p_hat = [0.33, 0.02, 0.25, 0.40]   # e3 > e0 > e2 > e1; gaps .07 and .08 < tau: r = 2
    # s = (.1817, .26, .3583) for e0, e1, e2: e0, rank 2 of the prediction, is the lowest
    s = sc.scores(0, [0, 1, 2], p_hat)
    assert min(s, key=s.__getitem__) == 0
    for boundary, evicted in (("nonresident", [(0, 1, 0)]), ("literal", [(0, 0, 0), (0, 1, 0), (0, 2, 0)])):
        pe = PreEvictor(sc, tau=0.1, r_max=2, boundary=boundary)
        pe._slots, pe._mine, pe.evictions, pe.fired = [3], [set()], 0, 0
        view = FakeView({0: [0, 1, 2]})
        pe.preevict(view, 0, p_hat, [3])   # type: ignore[arg-type]
        # nonresident: room for e3 alone (e0, e2 are resident), and never e0 or e2 evicted;
        # literal: 1 + 2 slots, taken in ascending s, e0 (the boundary expert) first
        assert view.evicted == evicted, boundary


def test_literal_redundancy_evicts_the_expert_it_makes_room_for() -> None:
    # two layers, two slots each, top-1. Layer 0 always runs e3. Layer 1 alternates e0, e1, and
    # layer 0's lookahead predicts it right with the other one (the resident expert of the
    # previous token) a close second: gap .036 < tau .05, so r = 1, room for that second one
    T = 6
    routed = [[[3], [t % 2]] for t in range(T)]
    look = np.zeros((T, 2, 4), dtype=np.float32)
    for t in range(T):
        look[t, 0, t % 2], look[t, 0, (t + 1) % 2] = 1.0, 0.9
        look[t, 1, 3] = 3.0   # next token's layer 0: e3, a steep boundary (r = 0)
    tr = make_trace(routed, num_experts=4, lookahead=look)
    kw = {"budget_experts": 4, "swap_out": True}
    _, m_lru = run_engine(tr, LRU(), tiny_model(2, 4, 1), tiny_hw(), **kw)
    _, m_lit = run_engine(tr, ActiveEvict(boundary="literal"), tiny_model(2, 4, 1), tiny_hw(), **kw)
    _, m_non = run_engine(tr, ActiveEvict(), tiny_model(2, 4, 1), tiny_hw(), **kw)
    one = 0.003   # GB per expert
    # literal: from token 1 on, Delta = 1 + 1 with one slot free, so the previous token's
    # expert (the only resident outside the predicted top-1) is evicted to make room for
    # itself, and the token after next misses it: layer 1 loads at every token, plus e3 once
    assert m_lit["demand_gb"] == pytest.approx((T + 1) * one) and m_lit["evictions"] == T - 1
    # nonresident: the boundary expert is resident, Delta = 1 = the free slot: nothing is
    # evicted and, as with LRU, layer 1 loads only at the first two tokens
    assert m_non["demand_gb"] == m_lru["demand_gb"] == pytest.approx(3 * one)
    assert m_non["evictions"] == 0 and m_non["dropped_per_token"] == 0


def test_free_slots_count_toward_the_target() -> None:
    pe, _ = _preevictor()
    view = FakeView({0: [0, 1]})       # one slot free: need = 2 - 1
    assert pe.preevict(view, 0, P_HAT, [1, 3]) == 1   # type: ignore[arg-type]
    assert view.evicted == [(0, 0, 0)]


def _planner(slots: int) -> BudgetTopKPlanner:
    pl = BudgetTopKPlanner()
    pl._k_max, pl._slots = 2, [slots]
    return pl


@pytest.mark.parametrize("resident,routing,width", [
    ([0, 1], [0, 2], 1),      # (a) avail 0: u(1) = 0, u(2) = 1
    ([0], [2, 3], 1),         # (b) avail 1: u(1) = 1, u(2) = 2
    ([0, 1], [2, 0], 1),      # (c) no feasible k: the top-1 still runs
    ([], [2, 3], 2),          # (d) avail 2
])
def test_spec2_dynamic_top_k_widths(resident: list[int], routing: list[int], width: int) -> None:
    view = FakeView({0: resident})
    assert _planner(2).widths(view, 0, np.array([routing])) == [width]  # type: ignore[arg-type]


def test_batch_tokens_share_the_free_slots_in_order() -> None:
    view = FakeView({0: [0]})
    # 2 slots, 1 free: token 0 loads 2 and keeps k = 1 (3 would need a second slot); token 1
    # finds 2 coming and 0 resident: both fit
    assert _planner(2).widths(view, 0, np.array([[2, 3], [2, 0]])) == [1, 2]  # type: ignore[arg-type]


def _spec3() -> tuple:  # type: ignore[type-arg]
    def one_hot(e: int) -> np.ndarray:
        v = np.zeros(4, dtype=np.float32)
        v[e] = 3.0
        return v

    routed = [[[1], [2]], [[1], [3]], [[0], [2]]]
    look = np.array([[one_hot(2), one_hot(1)], [one_hot(3), one_hot(0)], [one_hot(2), one_hot(0)]])
    tr = make_trace(routed, num_experts=4, lookahead=look)
    # 10 ms per copy each way, 1 ms attention, 1 ms per expert
    hw = tiny_hw(pcie_gbps=0.3, d2h_gbps=0.3, layer_us=1000, expert_us=1000)
    return tr, tiny_model(2, 4, 1), hw


def _token_ends_ms(eng) -> list[float]:  # type: ignore[no-untyped-def]
    return [round(s.t_end * 1e3, 6) for s in steps(eng) if s.layer == 1]


def test_spec3_decoupled_swap_timeline() -> None:
    tr, model, hw = _spec3()
    eng_lru, m_lru = run_engine(tr, LRU(), model, hw, budget_experts=2, swap_out=True)
    eng_ae, m_ae = run_engine(tr, ActiveEvict(tau=0.1), model, hw, budget_experts=2, swap_out=True)
    assert _token_ends_ms(eng_lru) == [24, 48, 92]
    assert m_lru["blocking_io_ms"] == pytest.approx(80)
    assert m_lru["io_busy_ms"] == pytest.approx(80)       # Offload: blocking = total I/O
    assert _token_ends_ms(eng_ae) == [24, 46, 70]
    assert m_ae["blocking_io_ms"] == pytest.approx(58)
    assert [round(s.stall_s * 1e3, 6) for s in steps(eng_ae)] == [10, 10, 0, 18, 10, 10]
    for m in (m_lru, m_ae):   # same bytes: 5 loads, 3 copy-backs
        assert m["demand_gb"] == pytest.approx(5 * 0.003)
        assert m["d2h_gb"] == pytest.approx(3 * 0.003)
    assert m_ae["prefetch_gb"] == 0 and m_ae["dropped_per_token"] == 0   # post-gate loads only (A9)
    assert not m_ae["warnings"]


def test_spec3_without_swap_out_both_policies_coincide_and_it_warns() -> None:
    tr, model, hw = _spec3()
    eng_lru, _ = run_engine(tr, LRU(), model, hw, budget_experts=2)
    eng_ae, m_ae = run_engine(tr, ActiveEvict(tau=0.1), model, hw, budget_experts=2)
    assert _token_ends_ms(eng_lru) == _token_ends_ms(eng_ae) == [24, 38, 62]
    assert any("swap_out" in w for w in m_ae["warnings"])


def test_preevict_before_layer_hides_less() -> None:
    tr, model, hw = _spec3()
    _, m = run_engine(tr, ActiveEvict(tau=0.1, preevict_at="before_layer"), model, hw,
                      budget_experts=2, swap_out=True)
    assert 58 < m["blocking_io_ms"] <= 80


def test_spec2a_dynamic_top_k_drops_the_miss_in_a_run() -> None:
    # one layer, two slots: token 0 loads 0 and 1; the lookahead predicts {0, 1}, so nothing is
    # pre-evicted; token 1 routes [0 (.5), 2 (.3)] with no free slot: it runs e0 alone
    look = np.array([[[3.0, 3.0, 0.0, 0.0]], [[3.0, 3.0, 0.0, 0.0]]], dtype=np.float32)
    w = np.array([[[0.6, 0.3]], [[0.5, 0.3]]], dtype=np.float32)
    tr = make_trace([[[0, 1]], [[0, 2]]], num_experts=4, lookahead=look, weights=w)
    eng, m = run_engine(tr, ActiveEvict(), tiny_model(1, 4, 2), tiny_hw(), budget_experts=2, swap_out=True)
    assert m["dropped_per_token"] == pytest.approx(0.5)
    assert m["demand_gb"] == pytest.approx(2 * 0.003)     # no transfer for token 1
    assert m["evictions"] == 0


def test_fixed_top_k_evicts_on_the_critical_path() -> None:
    look = np.array([[[3.0, 3.0, 0.0, 0.0]], [[3.0, 3.0, 0.0, 0.0]]], dtype=np.float32)
    tr = make_trace([[[0, 1]], [[0, 2]]], num_experts=4, lookahead=look)
    _, m = run_engine(tr, ActiveEvict(dynamic_topk=False), tiny_model(1, 4, 2), tiny_hw(),
                      budget_experts=2, swap_out=True)
    assert m["dropped_per_token"] == 0 and m["demand_gb"] == pytest.approx(3 * 0.003)
    assert m["evictions"] == 1


def test_preeviction_composes_with_another_cache() -> None:
    class LruPreevict(Composed):
        name = "test-lru-preevict"

        def __init__(self) -> None:
            self.assemble(cache=LRUCache(), prefetcher=PreEvictor(
                ImportanceScorer(alpha=0.5, gamma=0.9, window=32, score="combined"), tau=0.1, r_max=1))

    tr, model, hw = _spec3()
    eng, m = run_engine(tr, LruPreevict(), model, hw, budget_experts=2, swap_out=True)
    assert _token_ends_ms(eng) == [24, 46, 70]
    assert m["blocking_io_ms"] == pytest.approx(58)


def test_a_run_where_preeviction_never_fires_says_so() -> None:
    tr = random_trace(5, layers=3, experts=8, top_k=2)
    # everything fits and tau = 0 asks for no spare slot: nothing to pre-evict
    _, m = run_engine(tr, ActiveEvict(tau=0.0), tiny_model(3, 8, 2), tiny_hw(), budget_experts=24, swap_out=True)
    assert any("never fired" in w for w in m["warnings"])
    _, m = run_engine(tr, ActiveEvict(), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6, swap_out=True)
    assert not any("never fired" in w for w in m["warnings"])


@pytest.mark.parametrize("params", [{"alpha": 1.5}, {"gamma": 0.0}, {"window": 0}, {"tau": -1},
                                    {"r_max": -1}, {"k_max": 0}, {"score": "x"},
                                    {"boundary": "x"}, {"redundancy": "x"}, {"preevict_at": "x"}])
def test_bad_parameters_are_refused(params: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(PolicyError):
        make_policy("activeevict", params)


def test_moe_apex_style_prefetches_more_than_mixtral_offloading() -> None:
    tr = random_trace(6, layers=3, experts=8, top_k=2, decode=12)
    kw = {"budget_experts": 12, "swap_out": True}
    _, m_apex = run_engine(tr, make_policy("moe-apex-style"), tiny_model(3, 8, 2), tiny_hw(), **kw)  # type: ignore[arg-type]
    _, m_mix = run_engine(tr, make_policy("mixtral-offloading"), tiny_model(3, 8, 2), tiny_hw(), **kw)  # type: ignore[arg-type]
    assert m_apex["prefetch_gb"] > m_mix["prefetch_gb"] > 0


def test_regret_counts_a_preevicted_expert_its_routing_needed() -> None:
    tr, model, hw = _spec3()
    pol = ActiveEvict(tau=0.1)
    run_engine(tr, pol, model, hw, budget_experts=2, swap_out=True)
    assert pol.pre_evictor.regret == 0 and pol.pre_evictor.evictions == 3
    # token 1's lookahead still predicts e3 at layer 1, but layer 1 routes e2: the pre-evicted one
    look = np.zeros((3, 2, 4), dtype=np.float32)
    look[0, 0, 2] = look[0, 1, 1] = look[1, 0, 3] = look[1, 1, 0] = look[2, 0, 2] = look[2, 1, 0] = 3.0
    tr2 = make_trace([[[1], [2]], [[1], [2]], [[0], [2]]], num_experts=4, lookahead=look)
    pol = ActiveEvict(tau=0.1)
    run_engine(tr2, pol, model, hw, budget_experts=2, swap_out=True)
    assert pol.pre_evictor.regret == 1


_P = st.lists(st.one_of(st.sampled_from([0.0, -0.0, 0.25, 0.5, float("nan"), float("inf")]),
                        st.floats(0, 1, allow_nan=False)), min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(p=_P, k=st.integers(0, 10), tau=st.sampled_from([0.0, 0.05, 0.3]), r_max=st.integers(0, 4),
       redundancy=st.sampled_from(["literal", "run"]), boundary=st.sampled_from(["literal", "nonresident"]),
       present=st.sets(st.integers(0, 9), max_size=10))
def test_release_plan_given_the_order_equals_its_own_sort(
        p: list[float], k: int, tau: float, r_max: int, redundancy: str, boundary: str, present: set[int]) -> None:
    # after_layer ranks p_hat once and hands the order down (Eq. 16/17); the answer must be the one
    # the functions reach by sorting p themselves, NaNs, ties and -0.0 included
    top = descending(p)[:k]
    kw = {"tau": tau, "r_max": r_max, "redundancy": redundancy}
    assert redundancy_of(p, k, order=descending(p), **kw) == redundancy_of(p, k, **kw)
    assert release_plan(p, present, top, boundary=boundary, order=descending(p), **kw) == \
        release_plan(p, present, top, boundary=boundary, **kw)
