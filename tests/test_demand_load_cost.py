"""``runtime.demand_load_us``: the host-side cost of each demand load on the critical path, paid
before the load is queued, on the event loop and on both fast replays alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import RuntimeSpec
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import make_trace, tiny_hw, tiny_model


def _run(trace: Any, policy: str, *, demand_us: float, budget: int, fast: bool, check: bool = True,
         hw: Any = None, batch: int = 1) -> tuple[Engine, dict[str, Any]]:
    m = trace.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    wl = build_workload(trace, batch_size=batch, phases=["prefill", "decode"])
    rt = RuntimeSpec(name="t", demand_load_us=demand_us)
    eng = Engine(wl, make_policy(policy), CostModel(model, hw or tiny_hw(), rt),
                 budget_bytes=budget * model.expert_bytes, check_invariants=check, fast_replay=FAST_PATH if fast else None)
    eng.run()
    return eng, compute_metrics(eng.state)


HAND = [[[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]]]


@pytest.mark.parametrize("fast,check", [(False, True), (True, True), (True, False)])
def test_exact_timeline_with_demand_cost(fast: bool, check: bool) -> None:
    """One lane, 1000 us per load, 100 us layer, 50 us expert, 30 us per demand load, two slots.
    Tokens 0, 1 and 3 miss both experts: 100 + 2 x 30 + 1000 + 1000 + 50 = 2210 us. Token 2 hits
    expert 2 and misses 0: 100 + 30 + 1000 + 50 = 1180 us (the hit computes while 0 loads)."""
    trace = make_trace(HAND, num_experts=4)
    eng, m = _run(trace, "lru", demand_us=30.0, budget=2, fast=fast, check=check)
    assert eng.state.path.startswith("fast") == fast
    ends = np.asarray(eng.state.steps.columns()["t_end"]) * 1e6
    assert np.allclose(np.diff(np.concatenate([[0.0], ends])), [2210, 2210, 1180, 2210])
    # stall: everything but the layer (100) and the two experts (2 x 50), the demand cost included
    assert m["stall_ms"] == pytest.approx((2210 - 200) * 3 / 1e3 + (1180 - 200) / 1e3)


def test_zero_demand_cost_changes_nothing() -> None:
    """The default (0) leaves every figure as it was, bit for bit."""
    trace = make_trace(HAND, num_experts=4)
    _, a = _run(trace, "lru", demand_us=0.0, budget=2, fast=False)
    _, b = _run(trace, "lru", demand_us=1e-9, budget=2, fast=False)
    _, c = _run(trace, "lru", demand_us=0.0, budget=2, fast=False)
    assert a == c and a["sim_time_s"] < b["sim_time_s"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=hs.sampled_from(["lru", "fifo", "lfu", "random", "belady"]), layers=hs.integers(1, 3),
       experts=hs.integers(2, 6), tokens=hs.integers(1, 30), lanes=hs.integers(1, 2),
       demand_us=hs.sampled_from([10.0, 50.0, 1000.0]), extra=hs.integers(0, 2), seed=hs.integers(0, 10**6))
def test_fast_paths_charge_it_as_the_event_loop(policy: str, layers: int, experts: int, tokens: int,
                                                lanes: int, demand_us: float, extra: int, seed: int) -> None:
    """Metrics and step records equal, bit for bit, across the event loop, the generic fast
    replay and the cache kernels, with a demand-load cost."""
    rng = np.random.default_rng(seed)
    k = min(2, experts)
    ex = np.stack([np.stack([rng.choice(experts, k, replace=False) for _ in range(layers)]) for _ in range(tokens)])
    trace = make_trace(ex, num_experts=experts)
    hw = tiny_hw(copy_engines=lanes, evict_us=5.0)
    budget = layers * (k + extra)
    slow, ms = _run(trace, policy, demand_us=demand_us, budget=budget, fast=False, hw=hw)
    ms.pop("engine_path")
    ms.pop("engine_path_reason")   # why the event loop ran, where it did
    for check in (True, False):
        fast, mf = _run(trace, policy, demand_us=demand_us, budget=budget, fast=True, check=check, hw=hw)
        assert fast.state.path.startswith("fast"), fast.state.path_reason
        mf.pop("engine_path")
        mf.pop("engine_path_reason")   # why the event loop ran, where it did
        assert mf == ms
        cf, cs = fast.state.steps.columns(), slow.state.steps.columns()
        for name in cs:
            np.testing.assert_array_equal(cf[name], cs[name], err_msg=name)
