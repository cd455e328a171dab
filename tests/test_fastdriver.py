"""The SimPy-free driver (sim/fast/driver.py) against the SimPy event loop, the GPU stream of
sim/engine/layer_loop.py under its two interpreters (and the fast path's kernels where they take
a run): same metrics and step records, bit for bit, for every registered policy (prefetching ones included) on random
traces, budgets and hardware (several copy lanes, both queue orders, eviction, demand-load
and prefetch-issue costs, a transfer buffer, synchronous prefetch, swap-out), timelines included; round cost figures make copies land at exactly the instant compute
ends, so ties must resolve as SimPy resolves them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.registry import make_policy, policy_names
from moesim.sim.config.catalog import get_runtime
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.traces.format.trace_file import DECODE, PREFILL
from tests.util import assert_same_replays, make_trace, tiny_hw, tiny_model

POLICIES = sorted(policy_names())
EXAMPLES = int(os.environ.get("MOESIM_FASTDRIVER_EXAMPLES", "120"))


def _run(trace: Any, policy: str, *, fast: bool, budget: int, batch: int, hw: Any, runtime: Any, initial: str,
         seed: int, order: str, buffer: int, sync: bool, timeline: bool, swap: bool) -> tuple[Engine, dict[str, Any]] | str:
    m = trace.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    wl = build_workload(trace, batch_size=batch, phases=["prefill", "decode"])
    try:
        eng = Engine(wl, make_policy(policy), CostModel(model, hw, get_runtime(runtime)),
                     budget_bytes=budget * model.expert_bytes, seed=seed, initial=initial, pcie_order=order,
                     buffer_bytes=buffer * model.expert_bytes, sync_prefetch=sync, record_timeline=timeline,
                     swap_out=swap, serial_swap=swap and seed % 2 == 0,
                     check_invariants=True, fast_replay=FAST_PATH if fast else None)
        eng.run()
    except MoesimError as exc:   # a run the policy cannot make (both paths must say the same)
        return f"{type(exc).__name__}: {exc}"
    return eng, compute_metrics(eng.state)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=hs.sampled_from(POLICIES),
    layers=hs.integers(1, 3), experts=hs.integers(2, 8), top_k=hs.integers(1, 2),
    tokens=hs.integers(1, 30), requests=hs.integers(1, 3), prompt=hs.integers(0, 3), batch=hs.integers(1, 2),
    slots=hs.integers(1, 5), lanes=hs.integers(1, 3), order=hs.sampled_from(["priority", "priority", "fifo"]),
    gbps=hs.sampled_from([0.3, 3.0, 30.0]), evict_us=hs.sampled_from([0.0, 0.0, 5.0]),
    latency_us=hs.sampled_from([0.0, 10.0]), layer_us=hs.sampled_from([0.0, 100.0, 1000.0]),
    expert_us=hs.sampled_from([0.0, 50.0, 500.0]), demand_load_us=hs.sampled_from([0.0, 0.0, 20.0]),
    issue_us=hs.sampled_from([0.0, 0.0, 10.0]), initial=hs.sampled_from(["empty", "random", "popular"]),
    buffer=hs.sampled_from([0, 0, 1, 2]), sync=hs.sampled_from([False, False, True]), timeline=hs.booleans(),
    swap=hs.sampled_from([False, True]),
    seed=hs.integers(0, 10**6),
)
def test_driver_equals_event_loop(policy: str, layers: int, experts: int, top_k: int, tokens: int,
                                  requests: int, prompt: int, batch: int, slots: int, lanes: int, order: str,
                                  gbps: float, evict_us: float, latency_us: float, layer_us: float,
                                  expert_us: float, demand_load_us: float, issue_us: float, initial: str,
                                  buffer: int, sync: bool, timeline: bool, swap: bool, seed: int) -> None:
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    ex = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)])
                   for _ in range(tokens)])
    req = np.unique(np.sort(rng.integers(0, requests, tokens)), return_inverse=True)[1]   # none skipped
    first = {int(r): int(np.argmax(req == r)) for r in set(req.tolist())}
    phases = [PREFILL if t - first[int(req[t])] < prompt else DECODE for t in range(tokens)]
    look = rng.normal(size=(tokens, layers, experts)).astype(np.float16)
    trace = make_trace(ex, num_experts=experts, requests=req.tolist(), phases=phases, lookahead=look)
    hw = tiny_hw(copy_engines=lanes, pcie_gbps=gbps, evict_us=evict_us, latency_us=latency_us,
                 layer_us=layer_us, expert_us=expert_us)
    runtime = {"name": "t", "demand_load_us": demand_load_us, "prefetch_issue_us": issue_us}
    kw: dict[str, Any] = {"budget": layers * slots, "batch": batch, "hw": hw, "runtime": runtime,
                          "initial": initial, "seed": seed, "order": order, "buffer": buffer, "sync": sync,
                          "timeline": timeline, "swap": swap}
    slow = _run(trace, policy, fast=False, **kw)
    fast = _run(trace, policy, fast=True, **kw)
    if isinstance(slow, str) or isinstance(fast, str):
        assert isinstance(slow, str) and slow == fast, (slow, fast)
        return
    (se, ms), (fe, mf) = slow, fast
    assert se.state.path == "event"
    assert fe.state.path.startswith("fast"), fe.state.path_reason   # copies issued by warm() included
    assert_same_replays(se, ms, fe, mf, what=f"{policy}: ")
    assert fe.state.timeline == se.state.timeline
