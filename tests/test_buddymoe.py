"""BuddyMoE (policies/buddymoe/policy.py and its parts): the spec sheet's hand-checkable cases
(``buddymoe.md`` section 8) as exact numbers and timelines, the gates one by one, the online
profile, the base, and the composition with MoEpic's split cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moesim.policies.buddymoe.coactivation import (
    CoactivationProfile,
    buddy_lists,
    coactivation_counts,
    conditional,
)
from moesim.policies.buddymoe.planner import BuddySubstitutePlanner
from moesim.policies.buddymoe.policy import BuddyMoE
from moesim.policies.buddymoe.tae import calibrate_tau, tae
from moesim.policies.contract.base import ABSENT, RESIDENT, PolicySetupError, Profile, Routing
from moesim.policies.contract.registry import PolicyError, make_policy
from moesim.policies.parts.caches import CacheRule, LCPCache, LRUCache
from moesim.policies.parts.compose import Composed
from tests.util import make_trace, random_trace, run_engine, step_us, tiny_hw, tiny_model

# --- test 1: profile -> buddy lists (Eqs. 4-6), TAE (Eq. 1) ------------------------------------
PROFILE_TOKENS = [[0, 1], [0, 1], [0, 1], [0, 2], [1, 2], [2, 3]]


def _spec1() -> tuple[np.ndarray, np.ndarray]:
    ex = np.asarray(PROFILE_TOKENS)[:, None, :]          # [T, L=1, k=2]
    return coactivation_counts(ex, 4)


def test_spec1_counts_and_conditional() -> None:
    A, M = _spec1()
    assert A[0].tolist() == [4, 4, 3, 1]
    expect = np.zeros((4, 4))
    for (i, j), c in {(0, 1): 3, (0, 2): 1, (1, 2): 1, (2, 3): 1}.items():
        expect[i, j] = expect[j, i] = c
    np.testing.assert_array_equal(M[0], expect)
    q = conditional(M)[0]
    np.testing.assert_allclose(q[0], [0, 0.75, 0.25, 0])
    np.testing.assert_allclose(q[1], [0.75, 0, 0.25, 0])
    np.testing.assert_allclose(q[2], [1 / 3, 1 / 3, 0, 1 / 3])
    np.testing.assert_allclose(q[3], [0, 0, 1, 0])
    # epsilon smoothing stays off the diagonal: q(3|3) = 0, every peer of 3 gets some mass
    qs = conditional(M, epsilon=1.0)[0]
    assert qs[3, 3] == 0 and qs[3].tolist() == pytest.approx([1 / 4, 1 / 4, 2 / 4, 0])


@pytest.mark.parametrize("alpha,k_max,lists", [
    (0.7, 16, [[1], [0], [0, 1, 3], [2]]),
    (0.8, 16, [[1, 2], [0, 2], [0, 1, 3], [2]]),
    (0.8, 2, [[1, 2], [0, 2], [0, 1], [2]]),
])
def test_spec1_buddy_lists(alpha: float, k_max: int, lists: list[list[int]]) -> None:
    A, M = _spec1()
    assert buddy_lists(conditional(M), A, alpha, k_max) == [lists]
    assert CoactivationProfile(A, M).buddies(alpha, k_max)[0] == [lists]


def test_spec1_never_active_expert_has_no_buddies_and_weighted_counts() -> None:
    ex = np.asarray([[0, 1], [0, 2]])[:, None, :]
    A, M = coactivation_counts(ex, 4)
    assert buddy_lists(conditional(M, epsilon=0.5), A, 0.9, 4)[0][3] == []
    w = np.asarray([[0.6, 0.2], [0.3, 0.3]])[:, None, :]
    _, Mw = coactivation_counts(ex, 4, w, mode="weighted")
    # renormalised: (0.75, 0.25) -> min 0.25; (0.5, 0.5) -> min 0.5
    assert Mw[0, 0, 1] == pytest.approx(0.25) and Mw[0, 2, 0] == pytest.approx(0.5)


def test_spec1_tae_values_and_percentile_calibration() -> None:
    w = np.asarray([[0.9, 0.1], [0.6, 0.4], [0.5, 0.5]])
    np.testing.assert_allclose(tae(w), [0.469, 0.971, 1.0], atol=5e-4)
    assert tae(np.asarray([[0.45, 0.05]]))[0] == pytest.approx(0.469, abs=5e-4)   # renormalised
    assert tae(np.asarray([[0.9, 0.1]]), temperature=0.5)[0] < tae(np.asarray([[0.9, 0.1]]))[0]
    # 10 profiling tokens in one layer: TAE of (0.9, 0.1) four times, (0.5, 0.5) six times
    prof = np.asarray([[0.9, 0.1]] * 4 + [[0.5, 0.5]] * 6)[:, None, :]
    assert calibrate_tau(prof, 20)[0] == pytest.approx(0.469, abs=5e-4)
    assert calibrate_tau(prof, 50)[0] == pytest.approx(1.0)


# --- shared set-up of tests 2 and 3 -------------------------------------------------------------
class BuddyOn(Composed):
    """A buddy planner on a given cache (the parts as a user would compose them)."""

    name = "buddy-on"
    lossy = True

    def __init__(self, planner: BuddySubstitutePlanner, cache: CacheRule | None = None) -> None:
        self.assemble(cache=cache if cache is not None else LRUCache(), planner=planner)


def _run(tokens: list[list[list[int]]], weights: list[list[list[float]]], policy: Any,
         **kw: Any) -> tuple[Any, dict[str, Any]]:
    tr = make_trace(tokens, num_experts=4, weights=np.asarray(weights, dtype=np.float32))
    return run_engine(tr, policy, tiny_model(2, 4, 2), tiny_hw(), budget_experts=4, **kw)


HALF = [[0.5, 0.5], [0.5, 0.5]]
LOAD_GB = 0.003   # one 3 MB expert
LISTS2 = [[[1], [0], [1, 3], [2]], [[1], [0], [3], [1, 0]]]


def test_spec2_a_swap_replaces_a_demand_load() -> None:
    tokens = [[[0, 1], [0, 1]], [[0, 2], [1, 3]]]
    planner = BuddySubstitutePlanner(lists=LISTS2, search_depth=2)
    eng, m = _run(tokens, [HALF, HALF], BuddyOn(planner))
    assert step_us(eng) == [2150, 2150, 200, 200]
    assert m["sim_time_s"] * 1e6 == pytest.approx(4700)
    assert m["demand_gb"] == pytest.approx(4 * LOAD_GB)
    assert (m["hits"], m["misses"]) == (4, 4)
    assert m["substitutions_per_token"] == 1.0
    assert m["routing_mass_kept"] == pytest.approx(0.75)
    assert planner.counts.swaps == 2 and planner.counts.no_buddy == 4   # t0: nothing resident yet
    # plain LRU on the same trace: one load per layer at t1
    eng_lru, m_lru = _run(tokens, [HALF, HALF], make_policy("lru"))
    assert step_us(eng_lru) == [2150, 2150, 1150, 1150]
    assert m_lru["demand_gb"] == pytest.approx(6 * LOAD_GB)


# --- test 3: gates -------------------------------------------------------------------------------
LISTS3 = [[[2, 3], [3, 2], [0, 1], [1, 0]]] * 2
T0 = [[[2, 3], [2, 3]]]
W0 = [[[0.6, 0.4], [0.6, 0.4]]]


def _spec3(t1: list[list[int]], w1: list[list[float]], **params: Any) -> tuple[list[float], dict[str, Any],
                                                                                 BuddySubstitutePlanner]:
    planner = BuddySubstitutePlanner(lists=LISTS3, search_depth=2, **params)
    eng, m = _run(T0 + [t1], W0 + [w1], BuddyOn(planner))
    return step_us(eng), m, planner


def test_spec3a_tae_gate() -> None:
    steps, m, pl = _spec3([[0, 1], [0, 1]], [[0.9, 0.1], [0.5, 0.5]], tau=0.5)
    assert steps == [2150, 2150, 2150, 200]
    assert m["demand_gb"] == pytest.approx(6 * LOAD_GB) and pl.counts.swaps == 2 and pl.counts.tae_blocked == 1
    # the gate needs the router weights: a trace without them is refused at set-up
    tr = make_trace(T0, num_experts=4)
    with pytest.raises(PolicySetupError, match="weights"):
        run_engine(tr, BuddyOn(BuddySubstitutePlanner(lists=LISTS3, tau=0.5)), tiny_model(2, 4, 2),
                   tiny_hw(), budget_experts=4)


def test_spec3b_rho_caps_swaps_per_token() -> None:
    steps, m, pl = _spec3([[0, 1], [0, 1]], HALF, rho=1)
    assert steps == [2150, 2150, 1150, 1150]
    assert m["demand_gb"] == pytest.approx(6 * LOAD_GB) and pl.counts.swaps == 2 and pl.counts.rho_cut == 2


def test_spec3c_beta_bypasses_the_layer() -> None:
    steps, m, pl = _spec3([[0, 1], [0, 1]], HALF, beta=1.0)
    assert steps == [2150, 2150, 2150, 2150]
    assert m["demand_gb"] == pytest.approx(8 * LOAD_GB) and pl.counts.swaps == 0 and pl.counts.beta_bypassed == 4   # t0 too
    steps, m, pl = _spec3([[0, 1], [0, 1]], HALF)
    assert steps == [2150, 2150, 200, 200]
    assert m["demand_gb"] == pytest.approx(4 * LOAD_GB) and pl.counts.swaps == 4


def test_spec3d_uniqueness_and_fallback() -> None:
    steps, m, pl = _spec3([[0, 2], [0, 1]], HALF)
    assert steps == [2150, 2150, 200, 200]
    assert m["demand_gb"] == pytest.approx(4 * LOAD_GB) and pl.counts.swaps == 3
    # t0 is the fallback: no buddy is resident, so both misses of both layers load
    assert pl.counts.no_buddy == 4
    # fallback "drop": the same misses are dropped instead of loaded (nothing ever loads)
    steps, m, pl = _spec3([[0, 1], [0, 1]], HALF, fallback="drop")
    assert m["demand_gb"] == pytest.approx(0 * LOAD_GB) and m["dropped_per_token"] == 4.0 and steps == [100, 100, 100, 100]


def test_search_depth() -> None:
    # search depth H = 1: B(3) = [1, 0] at layer 1 of spec 2 only tries 1, which the token uses
    tokens = [[[0, 1], [0, 1]], [[0, 2], [1, 3]]]
    planner = BuddySubstitutePlanner(lists=LISTS2, search_depth=1)
    eng, m = _run(tokens, [HALF, HALF], BuddyOn(planner))
    assert step_us(eng) == [2150, 2150, 200, 1150] and planner.counts.swaps == 1


class FakeView:
    """Residency, logits and phase of one decode step, for a planner called directly."""

    def __init__(self, resident: set[int], logits: np.ndarray) -> None:
        self.resident, self._logits = resident, logits
        self.iteration = type("It", (), {"phase_name": "decode"})()

    def state(self, layer: int, expert: int, part: int = 0) -> int:
        return RESIDENT if expert in self.resident else ABSENT

    def is_resident(self, layer: int, expert: int) -> bool:
        return expert in self.resident

    def logits(self, layer: int) -> np.ndarray:
        return self._logits


@pytest.mark.parametrize("eta,buddy", [(0.0, 1), (1.0, 2)])
def test_eta_reranks_buddies_by_psi(eta: float, buddy: int) -> None:
    # q(1|0) = 0.6, q(2|0) = 0.4; the token's normalised logit is 0 for 1 and 1 for 2:
    # Psi(1) = 0.6, Psi(2) = 0.4 (1 + eta), so eta = 1 prefers 2 (Eq. 3), eta = 0 keeps the list
    A, M = coactivation_counts(np.asarray([[0, 1]] * 3 + [[0, 2]] * 2)[:, None, :], 5)
    pl = BuddySubstitutePlanner(eta=eta, alpha=1.0)
    pl.buddies, q = CoactivationProfile(A, M).buddies(1.0, 4)
    pl.q, pl.tau_l = q, np.zeros(1)
    assert pl.buddies[0][0] == [1, 2]
    view = FakeView({1, 2, 3}, np.asarray([[0.0, 0.0, 1.0, 0.5, 0.5]]))
    plan = pl.on_routed(view, 0, Routing(0, np.asarray([[0, 3]]), np.asarray([[0.3, 0.3]])))  # type: ignore[arg-type]
    assert plan is not None and plan.experts.tolist() == [[buddy, 3]]


def _prof(tokens: list[list[list[int]]], weights: np.ndarray | None = None) -> Profile:
    ex = np.asarray(tokens, dtype=np.int16)
    T = ex.shape[0]
    return Profile(experts=ex, weights=weights, logits=None, lookahead_logits=None,
                   request_id=np.zeros(T, dtype=np.int64), phase=np.ones(T, dtype=np.int8),
                   iteration=np.arange(T), embedding=None, source="test")


def test_registered_policy_builds_lists_from_the_profile_split() -> None:
    # the profile makes 1 the buddy of 2 at layer 0 and 0 the buddy of 3 at layer 1 (spec 2's swaps)
    prof = _prof([[[1, 2], [0, 3]]] * 3 + [[[0, 1], [0, 1]]])
    pol = BuddyMoE(base="lru", alpha=0.5, k_max=1)
    tokens = [[[0, 1], [0, 1]], [[0, 2], [1, 3]]]
    eng, m = _run(tokens, [HALF, HALF], pol, profile=prof)
    assert pol.planner is not None and pol.planner.buddies[0][2] == [1]   # type: ignore[attr-defined]
    assert step_us(eng) == [2150, 2150, 200, 200] and m["substitutions_per_token"] == 1.0
    assert not any("buddymoe" in w for w in m["warnings"])


def test_online_profile_without_a_split_warns_and_learns_causally() -> None:
    # without a profile nothing is known at t0; t0 makes 0 the buddy of 1; t1 loads 2 (no buddy
    # of 2 yet) evicting 1; at t2, 1 is absent and its buddy 0 resident: swapped in both layers
    pol = BuddyMoE(base="lru")
    tokens = [[[0, 1], [0, 1]], [[0, 2], [0, 2]], [[1, 3], [1, 3]]]
    eng, m = _run(tokens, [HALF] * 3, pol)
    assert any("profile" in w and "online" in w for w in m["warnings"])
    planner = pol.planner
    assert isinstance(planner, BuddySubstitutePlanner) and planner.counts.swaps == 2
    assert planner.buddies[0][1] == [0, 3] and step_us(eng)[4:] == [1150, 1150]   # lists after t2


def test_tau_percentile_needs_a_profile_with_weights() -> None:
    with pytest.raises(PolicySetupError, match="profile"):
        _run([[[0, 1], [0, 1]]], [HALF], BuddyMoE(base="lru", tau_percentile=10))
    prof = _prof([[[0, 1], [0, 1]]] * 5, np.asarray([[[0.9, 0.1], [0.5, 0.5]]] * 5))
    pol = BuddyMoE(base="lru", tau_percentile=50)
    _run([[[0, 1], [0, 1]]], [HALF], pol, profile=prof)
    assert pol.planner.tau_l.tolist() == pytest.approx([0.469, 1.0], abs=5e-4)   # type: ignore[attr-defined]


def test_base_must_be_a_lossless_per_layer_composition() -> None:
    assert type(BuddyMoE().cache).__name__ == "LRUCache" and BuddyMoE().prefetcher is not None
    for bad, why in [("fmoe", "global"), ("random-substitute", "lossless"), ("belady", "oracle"),
                     ("activeevict", "lossless")]:
        with pytest.raises(PolicyError, match=why):
            make_policy("buddymoe", {"base": bad})
    with pytest.raises(PolicyError, match="rho"):
        make_policy("buddymoe", {"rho": -1})
    assert make_policy("random-substitute", {"base": "mixtral-offloading"}).prefetcher is not None


def test_composes_with_moepic_split_cache() -> None:
    """MoEpic's LCP cache with BuddyMoE's planner: substitutions happen and remove demand loads."""
    tr = random_trace(5, layers=3, experts=8, top_k=2, requests=3, prompt=2, decode=10)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    _, base = run_engine(tr, make_policy("lcp"), model, hw, budget_experts=9)
    planner = BuddySubstitutePlanner(alpha=0.9, k_max=4)
    _, m = run_engine(tr, BuddyOn(planner, LCPCache()), model, hw, budget_experts=9)
    assert planner.counts.swaps > 0 and m["substitutions_per_token"] > 0
    assert m["demand_gb"] < base["demand_gb"] and m["sim_time_s"] < base["sim_time_s"]


def test_cpu_fallback_runs_the_misses_left_on_the_host() -> None:
    # nothing is ever loaded: every miss runs on the CPU, one expert after another (300 us each),
    # so each step is 100 (layer) + 2 x 300 us and no byte crosses PCIe
    from moesim.sim.config.catalog import get_hardware
    hw = get_hardware({**tiny_hw().model_dump(), "name": "tiny-cpu", "cpu": {"expert_us": 300, "call_us": 0}})
    tokens = [[[0, 1], [0, 1]], [[0, 2], [1, 3]]]
    tr = make_trace(tokens, num_experts=4, weights=np.asarray([HALF, HALF], dtype=np.float32))
    planner = BuddySubstitutePlanner(lists=LISTS2, fallback="cpu")
    eng, m = run_engine(tr, BuddyOn(planner), tiny_model(2, 4, 2), hw, budget_experts=4)
    assert step_us(eng) == [700, 700, 700, 700]
    assert m["demand_gb"] == 0 and m["cpu_expert_runs"] == 8 and planner.counts.no_buddy == 8
    # with 1 resident: 0 -> its buddy 1; 2's only buddy is 1, now used: 2 runs on the CPU
    pl = BuddySubstitutePlanner(fallback="cpu")
    pl.buddies, pl.tau_l = [[[1], [0], [1], [0]]], np.zeros(1)
    plan = pl.on_routed(FakeView({1}, np.zeros((1, 4))), 0,   # type: ignore[arg-type]
                        Routing(0, np.asarray([[0, 2]]), np.asarray([[0.5, 0.5]])))
    assert plan is not None and plan.experts.tolist() == [[1, 2]]
    assert plan.on_cpu is not None and plan.on_cpu.tolist() == [[False, True]]
