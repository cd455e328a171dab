"""fMoE (policies/fmoe/policy.py and its parts): the spec sheet's hand-checkable cases (``fmoe.md``
section 8), composition with another cache, its ablations and the ProMoE-style baseline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moesim.policies.contract.base import ABSENT, QUEUED, EvictionRequest, Profile, Reason
from moesim.policies.contract.registry import PolicyError, make_policy
from moesim.policies.fmoe.expert_maps import ExpertMapStore, select_by_mass
from moesim.policies.fmoe.map_cache import MapPriorityCache
from moesim.policies.fmoe.map_prefetch import ExpertMapPrefetcher
from moesim.policies.fmoe.policy import FMoE
from moesim.policies.parts.caches import LCPCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.prefetchers import Prefetcher
from moesim.traces.format.trace_file import DECODE, ModelInfo, TraceMeta, trace_from_columns
from tests.util import make_trace, random_trace, run_engine, steps, tiny_hw, tiny_model

P = np.array([0.5, 0.3, 0.15, 0.05])


@pytest.mark.parametrize("score,chosen", [(0.9, [0, 1]), (0.35, [0, 1]), (0.12, [0, 1, 2]),
                                          (-0.2, [0, 1, 2, 3])])
def test_spec1_prefetch_set_by_mass(score: float, chosen: list[int]) -> None:
    delta = float(np.clip(1 - score, 0, 1))
    assert [e for e, _ in select_by_mass(P, delta, 2)] == chosen
    assert [e for e, _ in select_by_mass(P, delta, 2, dynamic=False)] == [0, 1]


class RecordingView:
    """Records prefetches and re-rankings; every unit absent until prefetched (then queued)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, float]] = []
        self.queued: set[tuple[int, int]] = set()

    def state(self, layer: int, expert: int, part: int = 0) -> int:
        return QUEUED if (layer, expert) in self.queued else ABSENT

    def is_present(self, layer: int, expert: int, part: int = 0) -> bool:
        return (layer, expert) in self.queued

    def prefetch(self, layer: int, expert: int, part: int = 0, priority: float = 0.0,
                 into_buffer: bool = False) -> bool:
        self.queued.add((layer, expert))
        self.calls.append(("prefetch", layer, expert, round(priority, 6)))
        return True

    def reprioritize(self, layer: int, expert: int, part: int = 0, priority: float = 0.0) -> bool:
        self.calls.append(("rerank", layer, expert, round(priority, 6)))
        return True


def test_spec1_priority_p_over_distance_and_its_flip() -> None:
    pf = ExpertMapPrefetcher(prefetch_distance=3)
    pf._want = {3: {5: 0.2}, 4: {2: 0.5}, 5: {1: 0.9}}
    pf._l_now = 2
    view = RecordingView()
    pf.issued = 0
    pf.issue(view, 2)  # type: ignore[arg-type]
    assert view.calls == [("prefetch", 5, 1, 0.3), ("prefetch", 4, 2, 0.25), ("prefetch", 3, 5, 0.2)]
    view.calls.clear()
    del pf._want[3]
    pf._l_now = 3
    pf.issue(view, 3)  # type: ignore[arg-type]   # (4, e2) now .5, (5, e1) .45: re-ranked
    assert view.calls == [("rerank", 4, 2, 0.5), ("rerank", 5, 1, 0.45)]



def test_trajectory_span_rest_prefetches_every_later_layer_of_the_match() -> None:
    """``trajectory_span: rest`` (the authors' code, ExpertMapMatcher.traj_prefetch: layers
    ``l + d .. L - 1`` of the matched map): issue and the protected window reach past
    ``l_now + d``; ``target`` (the paper's text, the default) stops at ``l_now + d``."""
    for span, want in (("target", [("prefetch", 3, 5, 0.2)]),
                       ("rest", [("prefetch", 5, 1, 0.3), ("prefetch", 4, 2, 0.25), ("prefetch", 3, 5, 0.2)])):
        pf = ExpertMapPrefetcher(prefetch_distance=1, trajectory_span=span)
        pf._L, pf._window, pf.cache = 6, None, None
        pf._want = {3: {5: 0.2}, 4: {2: 0.5}, 5: {1: 0.9}}
        pf._l_now = 2
        view = RecordingView()
        pf.issued = 0
        pf.issue(view, 2)  # type: ignore[arg-type]
        assert view.calls == want
        assert pf.window() == {(t, e, 0) for _, t, e, _ in want}


# --- test 2: semantic, then trajectory matching, then the store's replacement -----------------
A = np.array([[.7, .1, .1, .1], [.1, .7, .1, .1], [.1, .1, .7, .1]])
B = np.array([[.1, .7, .1, .1], [.1, .1, .1, .7], [.7, .1, .1, .1]])
NEW = np.array([[.1, .7, .1, .1], [.1, .1, .2, .6], [.6, .2, .1, .1]])


def _spec2_run(layer_us: float = 5000, pol: FMoE | None = None) -> tuple[Any, dict[str, Any], FMoE]:
    L, J = 3, 4
    cols = {"request_id": np.zeros(L, dtype=np.int32), "token_idx": np.zeros(L, dtype=np.int32),
            "phase": np.full(L, DECODE, dtype=np.int8), "layer": np.arange(L, dtype=np.int16),
            "experts": np.array([[1], [3], [0]], dtype=np.int16),
            "weights": np.array([[.7], [.6], [.6]], dtype=np.float32),
            "logits": np.log(NEW).astype(np.float16),
            "embedding": np.array([[0.8, 0.6]], dtype=np.float16), "embedding_rows": np.array([0])}
    tr = trace_from_columns(cols, TraceMeta(ModelInfo("tiny", L, J, 1)))
    profile = Profile(experts=np.array([[[0], [1], [2]], [[1], [3], [0]]]), weights=None,
                      logits=np.log(np.stack([A, B])), lookahead_logits=None,
                      request_id=np.array([10, 11]), phase=np.array([DECODE, DECODE]),
                      iteration=np.array([0, 1]), embedding=np.array([[1.0, 0.0], [0.0, 1.0]]),
                      source="test")
    pol = pol or FMoE(prefetch_distance=1, store_capacity=2, match_us=0.0)
    eng, m = run_engine(tr, pol, tiny_model(L, J, 1), tiny_hw(layer_us=layer_us), budget_experts=8,
                        profile=profile)
    return eng, m, pol


def test_spec2_semantic_then_trajectory_prefetches() -> None:
    _, m, pol = _spec2_run()
    pf = pol.prefetcher
    assert isinstance(pf, ExpertMapPrefetcher)
    # layer 0: A (cos .8) gives (0, e0), wasted; layer 0 routes e1: a miss. Trajectory picks B
    # after layers 0 and 1: (1, e3) and (2, e0), both hits
    assert m["misses"] == 1 and m["hits"] == 2
    assert m["prefetch_gb"] == pytest.approx(3 * 0.003) and m["fetch_precision"] == pytest.approx(2 / 3)
    assert pf.matches == 3


def test_trajectory_span_rest_adds_the_matched_maps_later_layers() -> None:
    """In the spec-2 run (d = 1, three layers), the trajectory match after layer 0 (map B) also
    wants layer 2's e0 under ``rest``, one layer earlier than ``target`` does: three prefetches
    either way, the same hits and misses."""
    class Recording(ExpertMapPrefetcher):
        seen: list[dict[int, list[int]]]

        def after_layer(self, view: Any, layer: int, outcome: Any) -> None:
            super().after_layer(view, layer, outcome)
            self.seen.append({t: sorted(w) for t, w in self._want.items()})

    for span in ("target", "rest"):
        pol = FMoE(prefetch_distance=1, store_capacity=2, match_us=0.0, trajectory_span=span)
        maps = Recording(prefetch_distance=1, store_capacity=2, match_us=0.0, trajectory_span=span)
        maps.seen = []
        pol.assemble(cache=MapPriorityCache(maps=maps), prefetcher=maps)
        _, m, _ = _spec2_run(pol=pol)
        assert m["misses"] == 1 and m["hits"] == 2 and m["prefetch_gb"] == pytest.approx(3 * 0.003)
        assert maps.seen[0] == ({1: [3]} if span == "target" else {1: [3], 2: [0]})

def test_spec2_store_replaces_the_most_redundant_map() -> None:
    store = ExpertMapStore(2, 3, 4, 1)
    store.insert(np.array([1.0, 0.0]), A)
    store.insert(np.array([0.0, 1.0]), B)
    np.testing.assert_allclose(store.redundancy(np.array([0.8, 0.6]), NEW), [0.4864, 0.8591], atol=1e-4)
    assert store.insert(np.array([0.8, 0.6]), NEW) == 1
    _, _, pol = _spec2_run()
    pf = pol.prefetcher
    assert isinstance(pf, ExpertMapPrefetcher)
    np.testing.assert_allclose(pf.store.maps[0], A, atol=1e-6)            # A kept
    np.testing.assert_allclose(pf.store.maps[1], NEW, atol=2e-3)          # B replaced by the new map


def test_spec2_trajectory_scores() -> None:
    store = ExpertMapStore(2, 3, 4, 1)
    store.insert(np.array([1.0, 0.0]), A)
    store.insert(np.array([0.0, 1.0]), B)
    dots = store.layer_dots(0, NEW[0])
    y, s = store.trajectory(0, dots, float(NEW[0] @ NEW[0]))
    assert y == 1 and s == pytest.approx(1.0)
    dots = dots + store.layer_dots(1, NEW[1])
    y, s = store.trajectory(1, dots, float((NEW[:2] ** 2).sum()))
    assert y == 1 and s == pytest.approx(0.9912, abs=1e-4)


# --- test 3: eviction priority, pause on a miss -------------------------------------------------
class FakeMaps:
    def __init__(self) -> None:
        self.p = {(0, 1): .7, (1, 3): .6, (2, 0): .7}
        # what the cache rule reads: p of every expert, replaced (never changed) when p changes
        self.p_map = np.array([[self.p.get((layer, e), 0.0) for e in range(4)] for layer in range(3)])

    def p_evict(self, layer: int, expert: int) -> float:
        return self.p[(layer, expert)]

    def window(self) -> frozenset:  # type: ignore[type-arg]
        return frozenset({(2, 0, 0)})   # wanted for layers 2..3 (l_now = 1, d = 2)


@pytest.mark.parametrize("smoothing,protect,victim", [(1.0, True, (1, 3, 0)), (0.0, False, (2, 0, 0))])
def test_spec3a_eviction_priority(smoothing: float, protect: bool, victim: tuple) -> None:  # type: ignore[type-arg]
    cache = MapPriorityCache(smoothing, protect, maps=FakeMaps())  # type: ignore[arg-type]
    cache._J = 4
    cache.freq = {(0, 1, 0): 2, (1, 3, 0): 1, (2, 0, 0): 0}
    cands = [(0, 1, 0), (1, 3, 0), (2, 0, 0)]
    req = EvictionRequest(Reason.DEMAND, (1, 2, 0), 0, 1, cands)
    assert cache.choose_victim(None, req) == victim  # type: ignore[arg-type]


def test_spec3b_a_miss_goes_ahead_of_queued_prefetches_and_cancels_none() -> None:
    class XY(Prefetcher):
        def on_iteration_start(self, view):  # type: ignore[no-untyped-def]
            if view.iteration_index == 0:
                view.prefetch(3, 0, priority=0.5)   # X: starts at once
                view.prefetch(3, 1, priority=0.3)   # Y: queued

    class Pol(Composed):
        name = "test-fmoe-pause"
        scope = "global"

        def __init__(self) -> None:
            self.assemble(cache=MapPriorityCache(), prefetcher=XY())

    from tests.util import make_trace
    tr = make_trace([[[2], [0], [0], [0]]], num_experts=4)
    hw = tiny_hw(pcie_gbps=0.3, layer_us=4000, expert_us=0)     # 10 ms per expert, routed at 4 ms
    eng, m = run_engine(tr, Pol(), tiny_model(4, 4, 1), hw, budget_experts=8, timeline=True)
    assert round(steps(eng)[0].stall_s * 1e3, 6) == 16          # X lands at 10, the miss 10-20
    assert m["prefetch_gb"] == pytest.approx(2 * 0.003)          # Y still ran (20-30)
    assert m["fetch_precision"] == pytest.approx(0.5)                # X used at layer 3, Y not


# --- composition, ablations, baselines ---------------------------------------------------------
def _profiled(seed: int = 7) -> tuple[Any, Profile]:
    from moesim.sim.run.profile import profile_from_trace, trace_requests
    tr = random_trace(seed, layers=3, experts=8, top_k=2, requests=4, decode=8)
    reqs = trace_requests(tr)
    return tr, profile_from_trace(tr, reqs[:2], "test")


def test_map_prefetcher_composes_with_moepic_lcp_cache() -> None:
    class MapLcp(Composed):
        name = "test-map-lcp"
        scope = "global"

        def __init__(self) -> None:
            self.assemble(cache=LCPCache(), prefetcher=ExpertMapPrefetcher(prefetch_distance=1, match_us=0))

    tr, prof = _profiled()
    eng, m = run_engine(tr, MapLcp(), tiny_model(3, 8, 2), tiny_hw(), budget_experts=8, profile=prof,
                        phases=("prefill", "decode"))
    assert m["prefetch_gb"] > 0 and not any("no map-guided" in w for w in m["warnings"])


@pytest.mark.parametrize("params", [{}, {"semantic": False}, {"dynamic_threshold": False},
                                    {"matcher": "speculate"}, {"matcher": "hit-count"},
                                    {"eviction": "lru"}, {"eviction": "lfu"}])
def test_ablations_run_and_prefetch(params: dict) -> None:  # type: ignore[type-arg]
    tr, prof = _profiled()
    _, m = run_engine(tr, make_policy("fmoe", {"prefetch_distance": 1, **params}), tiny_model(3, 8, 2),
                      tiny_hw(), budget_experts=10, profile=prof, phases=("prefill", "decode"))
    assert m["prefetch_gb"] > 0


def test_matching_latency_is_charged() -> None:
    tr, prof = _profiled()
    kw: dict[str, Any] = {"budget_experts": 10, "profile": prof}
    _, m0 = run_engine(tr, FMoE(prefetch_distance=1, match_us=0), tiny_model(3, 8, 2), tiny_hw(), **kw)
    _, m1 = run_engine(tr, FMoE(prefetch_distance=1, match_us=40), tiny_model(3, 8, 2), tiny_hw(), **kw)
    assert m0["policy_cpu_ms"] == 0 and m1["policy_cpu_ms"] > 0


def test_cold_store_warns_and_fills_online() -> None:
    tr = random_trace(8, layers=3, experts=8, top_k=2, requests=2, decode=8)
    pol = FMoE(prefetch_distance=1)
    _, m = run_engine(tr, pol, tiny_model(3, 8, 2), tiny_hw(), budget_experts=10)
    assert any("starts empty" in w for w in m["warnings"])
    assert any("no router logits" in w for w in m["warnings"])
    pf = pol.prefetcher
    assert isinstance(pf, ExpertMapPrefetcher) and pf.store.n > 0 and m["prefetch_gb"] > 0


@pytest.mark.parametrize("params", [{"prefetch_distance": 0}, {"store_capacity": 0}, {"matcher": "x"},
                                    {"eviction": "x"}, {"freq_smoothing": -1}, {"match_us": -1},
                                    {"trajectory_span": "x"}])
def test_bad_parameters_are_refused(params: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(PolicyError):
        make_policy("fmoe", params)


def test_promoe_style_prefetches_beyond_the_next_layer() -> None:
    tr = random_trace(9, layers=4, experts=8, top_k=2, decode=10)
    _, m1 = run_engine(tr, make_policy("promoe-style", {"stride": 1}), tiny_model(4, 8, 2), tiny_hw(),
                       budget_experts=16)
    _, m3 = run_engine(tr, make_policy("promoe-style"), tiny_model(4, 8, 2), tiny_hw(), budget_experts=16)
    assert m3["prefetch_gb"] > m1["prefetch_gb"] > 0
    with pytest.raises(PolicyError):
        make_policy("promoe-style", {"stride": 0})


def test_fmoe_table_compares_every_system_on_one_global_pool() -> None:
    """benchmarks/fmoe_table.py gives fMoE and every baseline the same pool layout (one global
    pool, ``cache.scope: global``), so that scope alone does not move the comparison."""
    from benchmarks.fmoe_table import METHODS, scenario
    from benchmarks.paper_runs import run_scenario

    for policy, params, sync in METHODS.values():
        data = scenario(policy, params, sync, 12.0)
        assert data["cache"]["scope"] == "global"
    # the scenario key reaches the engine: lru (per-layer by default) runs on one pool
    small = scenario("lru", {}, True, 12.0, requests=2, profile=1, tokens=4)
    m, pol = run_scenario(small)
    assert pol.scope == "global" and m["expert_budget_gib"] == pytest.approx(12.0)
    m_layer, pol_layer = run_scenario({**small, "cache": {"gib": 12.0}})
    assert pol_layer.scope == "layer" and m_layer["ttft_ms"]["mean"] != m["ttft_ms"]["mean"]


def _lru_hits(scope: str, budget: float) -> tuple[int, int]:
    """Hits and accesses of LRU on 5 decode tokens that each route expert 0 at all 3 layers."""
    tr = make_trace([[[0]] * 3] * 5, num_experts=4)
    pol = make_policy("lru", {})
    pol.scope = scope
    _, m = run_engine(tr, pol, tiny_model(3, 4, 1), tiny_hw(), budget_experts=budget)
    return m["hits"], m["accesses"]


def test_lru_on_a_global_pool_smaller_than_a_tokens_working_set_never_hits() -> None:
    """Why fMoE's hit-rate ratio over DeepSpeed-Inference is not a row of
    measurements/fmoe-end-to-end.yaml: a token uses one expert per layer, layer after layer, and
    a global LRU pool of 2 experts for 3 layers evicts each one before its layer comes round
    again (0 hits of 15), where 3 slots, global or one per layer, keep all of them after the
    first token (12 of 15). Mixtral at 12 GiB is the same case: 64 experts a token, 36 slots."""
    assert _lru_hits("global", 2) == (0, 15)
    assert _lru_hits("global", 3) == (12, 15)
    assert _lru_hits("layer", 3) == (12, 15)


def test_fmoe_measurement_set_runs_every_system_on_one_global_pool() -> None:
    """measurements/fmoe-end-to-end.yaml gives fMoE and its baselines the one expert cache of the
    MoE-Infinity codebase they all run on (fMoE section 6.2), as benchmarks/fmoe_table.py does:
    the base declares ``cache.scope: global`` and no row or reference sets another scope."""
    from pathlib import Path

    import yaml

    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "measurements" / "fmoe-end-to-end.yaml")
                          .read_text())
    assert data["base"]["cache"]["scope"] == "global"
    for row in data["rows"]:
        for over in (row["set"], row.get("relative_to", {})):
            assert "cache.scope" not in over and "scope" not in over.get("cache", {})


def test_fmoe_measurement_set_averages_the_papers_three_models() -> None:
    """measurements/fmoe-end-to-end.yaml: fMoE's section 6.2 and 6.4 figures are averages over
    Mixtral-8x7B, Qwen1.5-MoE and Phi-3.5-MoE (Table 1), so every row is a ``mean_over`` those
    three catalog models (each with its own routed-expert shape in the trace), and no row sets a
    model of its own."""
    from pathlib import Path

    from moesim.sim.study.fit_spec import load_measurements
    from moesim.traces.synthetic.generator import SynthParams

    ms = load_measurements(Path(__file__).resolve().parents[1] / "measurements" / "fmoe-end-to-end.yaml")
    for row in ms.rows:
        assert "model" not in row.set
        assert [m["model"] for m in row.mean_over] == ["mixtral-8x7b", "qwen1.5-moe-a2.7b", "phi-3.5-moe"]
        for (data, ref), setup in zip(row.variants, row.mean_over, strict=True):
            assert SynthParams.model_validate(data["trace"]["synthetic"]).model == setup["model"]
            assert ref is not None and ref["model"] == data["model"] == setup["model"]
