"""The fast path (sim/fast/path.py) against the SimPy event loop: same metrics and step records,
bit for bit, on random traces and hardware, for every policy that declares itself demand-only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.base import Plan, Routing, View
from moesim.policies.contract.registry import make_policy, policy_names
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.planners import Planner
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import make_trace, tiny_hw, tiny_model

# every policy that declares itself demand-only: per-layer pools and one global pool
# (least-stale), lossless and lossy (random-substitute's plans only substitute)
DEMAND_ONLY = sorted(n for n in policy_names() if make_policy(n).demand_only())


def _run(trace: Any, policy: str, *, fast: bool, budget: int, batch: int, hw: Any, initial: str,
         seed: int, check: bool = True) -> tuple[Engine, dict[str, Any]]:
    m = trace.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    wl = build_workload(trace, batch_size=batch, phases=["prefill", "decode"])
    eng = Engine(wl, make_policy(policy), CostModel(model, hw), budget_bytes=budget * model.expert_bytes,
                 seed=seed, initial=initial, check_invariants=check, fast_replay=FAST_PATH if fast else None)
    eng.run()
    return eng, compute_metrics(eng.state)


def test_shipped_demand_caches_declare_it() -> None:
    """The demand caches take the fast path; policies that prefetch or pin do not."""
    assert {"lru", "lfu", "fifo", "random", "belady", "no-cache"} <= set(DEMAND_ONLY)
    for name in ("static", "mixtral-offloading", "lfu-prefetch" if "lfu-prefetch" in policy_names() else "static"):
        assert not make_policy(name).demand_only()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=hs.sampled_from(DEMAND_ONLY),
    layers=hs.integers(1, 3), experts=hs.integers(2, 8), top_k=hs.integers(1, 2),
    tokens=hs.integers(1, 40), requests=hs.integers(1, 3), batch=hs.integers(1, 2),
    extra=hs.integers(0, 3), lanes=hs.integers(1, 3), evict_us=hs.sampled_from([0.0, 5.0, 50.0]),
    latency_us=hs.sampled_from([0.0, 10.0]), layer_us=hs.sampled_from([0.0, 50.0, 100.0, 1000.0]),
    expert_us=hs.sampled_from([0.0, 50.0, 500.0, 1000.0]),
    initial=hs.sampled_from(["empty", "random", "popular"]), seed=hs.integers(0, 10**6),
)
def test_fast_path_equals_event_loop(policy: str, layers: int, experts: int, top_k: int, tokens: int,
                                     requests: int, batch: int, extra: int, lanes: int, evict_us: float,
                                     latency_us: float, layer_us: float, expert_us: float, initial: str,
                                     seed: int) -> None:
    """Round cost figures make copies land at exactly the instant compute ends: the ties must
    resolve as SimPy resolves them."""
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    ex = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)])
                   for _ in range(tokens)])
    req = np.unique(np.sort(rng.integers(0, requests, tokens)), return_inverse=True)[1]   # none skipped
    trace = make_trace(ex, num_experts=experts, requests=req.tolist())
    budget = layers * (min(batch * top_k, experts) + extra)
    hw = tiny_hw(copy_engines=lanes, evict_us=evict_us, latency_us=latency_us, layer_us=layer_us,
                 expert_us=expert_us)
    slow, ms = _run(trace, policy, fast=False, budget=budget, batch=batch, hw=hw, initial=initial, seed=seed)
    assert slow.state.path == "event" and ms.pop("engine_path") == "event"
    ms.pop("engine_path_reason")   # why the event loop ran, where it did
    cs = slow.state.steps.columns()
    # the generic fast replay (policy objects; VRAM invariant checked), and without the check
    # the cache kernels for lru, fifo, lfu, random and belady
    for check in (True, False):
        fast, mf = _run(trace, policy, fast=True, budget=budget, batch=batch, hw=hw, initial=initial,
                        seed=seed, check=check)
        assert fast.state.path.startswith("fast"), fast.state.path_reason
        assert ("kernel" in fast.state.path) == (not check and policy in ("lru", "fifo", "lfu", "random", "belady"))
        assert mf.pop("engine_path") == fast.state.path
        mf.pop("engine_path_reason")   # why the event loop ran, where it did
        assert mf == ms
        cf = fast.state.steps.columns()
        for name in cf:
            np.testing.assert_array_equal(cf[name], cs[name], err_msg=name)


def _tiny_run(policy: Any, *, budget: int, batch: int = 1, timeline: bool = False) -> Engine:
    trace = make_trace([[[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]]], num_experts=4, requests=[0, 0, 1, 1])
    model = tiny_model(1, 4, 2)
    wl = build_workload(trace, batch_size=batch, phases=["decode"])
    eng = Engine(wl, policy, CostModel(model, tiny_hw()), budget_bytes=budget * model.expert_bytes,
                 record_timeline=timeline, fast_replay=FAST_PATH)
    eng.run()
    return eng


def test_path_is_chosen_and_reported() -> None:
    """Automatic choice: the lru kernel for lru with room for a layer's experts; the SimPy-free
    driver with a timeline, for a prefetching policy, or when a batch's experts could outgrow a
    pool (demand loads may wait for room: the kernels do not model it)."""
    eng = _tiny_run(make_policy("lru"), budget=2)
    assert eng.state.path == "fast (lru kernel)" and compute_metrics(eng.state)["engine_path"] == eng.state.path
    # exact timeline of the hand case (one lane, 1000 us per load, 100 us layer, 50 us expert):
    # tokens 0, 1 and 3 miss both experts: 100 + 1000 + 1000 (second load) + 50 = 2150 us;
    # token 2 hits expert 2 (computes while 0 loads): 100 + 1000 + 50 = 1150 us
    assert compute_metrics(eng.state)["sim_time_s"] == pytest.approx((3 * 2150 + 1150) * 1e-6)
    assert _tiny_run(make_policy("lru"), budget=2, timeline=True).state.path == "fast"
    assert _tiny_run(make_policy("static"), budget=3).state.path == "fast"
    assert _tiny_run(make_policy("lru"), budget=3, batch=2).state.path == "fast"


class _Liar(LRUCache):
    """Says it loads on demand, then prefetches."""

    def on_access(self, view: View, layer: int, outcome: Any) -> None:
        super().on_access(view, layer, outcome)
        view.prefetch(layer, 3)


class _CpuPlanner(Planner):
    """Says it only substitutes, then runs every slot on the CPU."""

    def demand_only(self) -> bool:
        return True

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        return Plan(routing.experts, on_cpu=np.ones(routing.experts.shape, dtype=bool))


class _CpuLiar(Composed):
    name = "cpu-liar"
    lossy = True

    def __init__(self) -> None:
        self.assemble(cache=LRUCache(), planner=_CpuPlanner())


@pytest.mark.parametrize("make", [_Liar, _CpuLiar])
def test_false_demand_only_takes_the_driver(make: Any) -> None:
    """A policy that declares itself demand-only, then prefetches or plans CPU slots, is not
    taken by a cache kernel (it is not one rule) but by the SimPy-free driver, which replays
    what it does: the event loop's outputs."""
    assert make().demand_only()
    out = []
    for fast in (True, False):
        trace = make_trace([[[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]]], num_experts=4, requests=[0, 0, 1, 1])
        model = tiny_model(1, 4, 2)
        eng = Engine(build_workload(trace, batch_size=1, phases=["decode"]), make(), CostModel(model, tiny_hw()),
                     budget_bytes=3 * model.expert_bytes, fast_replay=FAST_PATH if fast else None)
        eng.run()
        assert eng.state.path == ("fast" if fast else "event")
        m = compute_metrics(eng.state)
        m.pop("engine_path")
        m.pop("engine_path_reason")
        out.append((m, {k: v.tolist() for k, v in eng.state.steps.columns().items()}))
    assert out[0] == out[1]


def test_substituting_policy_takes_the_generic_fast_replay() -> None:
    """random-substitute (lossy, its planner demand-only) takes the generic replay, not a kernel,
    and substitutes there: at budget 2 of 4 experts every token after the first finds an absent
    expert and a resident one it does not use."""
    eng = _tiny_run(make_policy("random-substitute"), budget=2)
    assert eng.state.path == "fast" and eng.state.stats.substitutions > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=hs.integers(1, 3), experts=hs.integers(2, 8), top_k=hs.integers(1, 2),
    tokens=hs.integers(1, 40), requests=hs.integers(1, 3), batch=hs.integers(1, 2),
    extra=hs.integers(0, 4), lanes=hs.integers(1, 3), evict_us=hs.sampled_from([0.0, 5.0]),
    layer_us=hs.sampled_from([0.0, 100.0]), expert_us=hs.sampled_from([0.0, 50.0, 500.0]),
    initial=hs.sampled_from(["empty", "popular"]), seed=hs.integers(0, 10**6),
)
def test_static_started_warm_takes_the_fast_path(layers: int, experts: int, top_k: int, tokens: int,
                                                 requests: int, batch: int, extra: int, lanes: int,
                                                 evict_us: float, layer_us: float, expert_us: float,
                                                 initial: str, seed: int) -> None:
    """``static`` started warm (its set resident, its first prefetches doing nothing) with
    staging room for a step's misses runs on its kernel, with the event loop's metrics; it
    takes the SimPy-free driver otherwise (and with the VRAM invariant checked)."""
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    ex = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)])
                   for _ in range(tokens)])
    req = np.unique(np.sort(rng.integers(0, requests, tokens)), return_inverse=True)[1]
    trace = make_trace(ex, num_experts=experts, requests=req.tolist())
    budget = layers * (top_k + extra)
    hw = tiny_hw(copy_engines=lanes, evict_us=evict_us, layer_us=layer_us, expert_us=expert_us)
    try:
        slow, ms = _run(trace, "static", fast=False, budget=budget, batch=batch, hw=hw, initial=initial, seed=seed)
    except Exception:   # a budget static cannot run with (the event loop's own one-line error)
        return
    ms.pop("engine_path")
    ms.pop("engine_path_reason")   # why the event loop ran, where it did
    cs = slow.state.steps.columns()
    for check in (True, False):
        fast, mf = _run(trace, "static", fast=True, budget=budget, batch=batch, hw=hw, initial=initial,
                        seed=seed, check=check)
        if initial == "empty" and fast.state.policy.cache.static:   # type: ignore[attr-defined]
            assert fast.state.path == "fast"   # its set is loaded at the first iteration: the driver
        assert fast.state.path == "fast" or (not check and fast.state.path == "fast (static kernel)")
        assert mf.pop("engine_path") == fast.state.path
        mf.pop("engine_path_reason")   # why the event loop ran, where it did
        assert mf == ms
        cf = fast.state.steps.columns()
        for name in cf:
            np.testing.assert_array_equal(cf[name], cs[name], err_msg=name)


def test_every_engine_option_is_declared() -> None:
    """The fast replays declare each of the engine's options (a new one is refused until it is
    declared), and each field of the specs and the workload a plain run has."""
    import inspect

    from moesim.sim.fast.refusal import ENGINE_OPTIONS, undeclared
    params = set(inspect.signature(Engine.__init__).parameters) - {"self", "workload", "policy", "cost",
                                                                    "budget_bytes", "fast_replay"}
    assert params == set(ENGINE_OPTIONS)
    eng = _tiny_run(make_policy("lru"), budget=2)
    assert set(eng.state.options) == params and undeclared(eng.state) is None


def test_an_undeclared_option_or_field_goes_to_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: a run with an option or a spec field the fast replays do not declare runs on
    the event loop, the option named in the reason."""
    from moesim.sim.fast import refusal
    trace = make_trace([[[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]]], num_experts=4, requests=[0, 0, 1, 1])
    model = tiny_model(1, 4, 2)
    eng = Engine(build_workload(trace, batch_size=1, phases=["decode"]), make_policy("lru"),
                 CostModel(model, tiny_hw()), budget_bytes=2 * model.expert_bytes, fast_replay=FAST_PATH)
    eng.state.options["kv_cache_bytes"] = 0
    eng.run()
    assert eng.state.path == "event" and "'kv_cache_bytes' is not declared" in eng.state.path_reason
    monkeypatch.setitem(refusal.SPEC_FIELDS, "runtime", refusal.SPEC_FIELDS["runtime"] - {"token_us"})
    eng = _tiny_run(make_policy("lru"), budget=2)
    assert eng.state.path == "event" and "runtime field 'token_us' is not declared" in eng.state.path_reason
