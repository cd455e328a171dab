"""The mixtral-offloading kernel (sim/fast/prefetch.py) against the SimPy event loop: same
metrics and step records, bit for bit, on random traces, budgets and hardware; an exact
timeline of a hand-made case; and the runs it refuses."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_runtime
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.kernel_choice import prefetch_refusal
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.traces.format.trace_file import DECODE, PREFILL
from tests.util import make_trace, tiny_hw, tiny_model

KERNEL = "fast (mixtral-offloading kernel)"
ORACLE = "fast (oracle-prefetch kernel)"
EXAMPLES = int(os.environ.get("MOESIM_FASTPREFETCH_EXAMPLES", "150"))


def _run(trace: Any, *, fast: bool, budget: int, batch: int = 1, hw: Any = None, params: Any = None,
         initial: str = "empty", seed: int = 0, runtime: Any = None, policy: str = "mixtral-offloading",
         **kw: Any) -> tuple[Engine, dict[str, Any]]:
    m = trace.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    runtime = get_runtime(runtime or {"name": "none"})
    wl = build_workload(trace, batch_size=batch, phases=["prefill", "decode"])
    eng = Engine(wl, make_policy(policy, params), CostModel(model, hw or tiny_hw(), runtime),
                 budget_bytes=budget * model.expert_bytes, seed=seed, initial=initial, fast_replay=FAST_PATH if fast else None, **kw)
    eng.run()
    return eng, compute_metrics(eng.state)


def _assert_same(trace: Any, **kw: Any) -> Engine:
    slow, ms = _run(trace, fast=False, **kw)
    assert slow.state.path == "event" and ms.pop("engine_path") == "event"
    ms.pop("engine_path_reason")   # why the event loop ran, where it did
    fast, mf = _run(trace, fast=True, **kw)
    want = ORACLE if kw.get("policy") == "oracle-prefetch" else KERNEL
    assert fast.state.path == want, fast.state.path_reason
    assert mf.pop("engine_path") == want
    mf.pop("engine_path_reason")   # why the event loop ran, where it did
    assert mf == ms
    cs, cf = slow.state.steps.columns(), fast.state.steps.columns()
    for name in cs:
        np.testing.assert_array_equal(cf[name], cs[name], err_msg=name)
    return fast


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=hs.integers(1, 4), experts=hs.integers(2, 8), top_k=hs.integers(1, 3),
    tokens=hs.integers(1, 40), requests=hs.integers(1, 3), prompt=hs.integers(0, 4),
    batch=hs.integers(1, 3), slots=hs.integers(1, 6),
    gbps=hs.sampled_from([0.3, 3.0, 30.0, 300.0]), latency_us=hs.sampled_from([0.0, 10.0]),
    layer_us=hs.sampled_from([0.0, 50.0, 100.0, 1000.0]), expert_us=hs.sampled_from([0.0, 50.0, 500.0, 1000.0]),
    evict_us=hs.sampled_from([0.0, 0.0, 5.0]), demand_load_us=hs.sampled_from([0.0, 0.0, 20.0]),
    overhead_us=hs.sampled_from([0.0, 0.0, 10.0, 100.0]),
    prefetch=hs.sampled_from([None, None, 0, 1, 3]), cross=hs.booleans(),
    source=hs.sampled_from(["auto", "lookahead", "previous-token", "no-lookahead", "oracle"]),
    ties=hs.booleans(), order=hs.sampled_from(["priority", "priority", "fifo"]), initial=hs.sampled_from(["empty", "random", "popular"]), seed=hs.integers(0, 10**6),
)
def test_kernel_equals_event_loop(layers: int, experts: int, top_k: int, tokens: int, requests: int,
                                  prompt: int, batch: int, slots: int, gbps: float, latency_us: float,
                                  layer_us: float, expert_us: float, evict_us: float,
                                  demand_load_us: float, overhead_us: float, prefetch: int | None,
                                  cross: bool, source: str, ties: bool, order: str,
                                  initial: str, seed: int) -> None:
    """Random traces (prefill iterations included), tight and roomy pools, slow and fast links,
    every predictor (``no-lookahead``: ``auto`` on a trace without lookahead logits falls back to
    the previous token; ``oracle``: oracle-prefetch): round cost figures make copies land at
    exactly the instant compute ends, and small integer logits make the lookahead's top-k tie;
    both must resolve as the event loop resolves them."""
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    ex = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)])
                   for _ in range(tokens)])
    req = np.unique(np.sort(rng.integers(0, requests, tokens)), return_inverse=True)[1]   # none skipped
    phases = [PREFILL if t == 0 or req[t] != req[t - 1] else DECODE for t in range(tokens)]
    for t in range(1, tokens):   # the first `prompt` tokens of each request are its prompt
        if req[t] == req[t - 1] and phases[t - 1] == PREFILL and sum(
                1 for s in range(t) if req[s] == req[t]) < prompt:
            phases[t] = PREFILL
    if prompt == 0:
        phases = [DECODE] * tokens
    look = (rng.integers(0, 3, (tokens, layers, experts)) if ties
            else rng.normal(size=(tokens, layers, experts))).astype(np.float16)
    trace = make_trace(ex, num_experts=experts, requests=req.tolist(), phases=phases,
                       lookahead=None if source == "no-lookahead" else look)
    hw = tiny_hw(pcie_gbps=gbps, latency_us=latency_us, layer_us=layer_us, expert_us=expert_us,
                 evict_us=evict_us)
    params: dict[str, Any] = {"cross_token": cross, "predictor": "auto" if source == "no-lookahead" else source}
    if prefetch is not None:
        params["prefetch_experts"] = prefetch
    policy = "mixtral-offloading"
    if source == "oracle":
        policy, params = "oracle-prefetch", {}
    _assert_same(trace, policy=policy, budget=layers * slots, batch=batch, hw=hw, params=params, initial=initial,
                 pcie_order=order, seed=seed, runtime={"name": "t", "demand_load_us": demand_load_us, "layer_us": overhead_us / 2,
                                     "iteration_us": overhead_us, "token_us": overhead_us / 10})


def _hand_trace() -> Any:
    """Two layers, four experts, top-1, three tokens; the lookahead guesses layer 1 right for
    tokens 0 and 2 and wrong for token 1."""
    look = np.zeros((3, 2, 4), dtype=np.float16)
    look[0, 0, 1] = 1.0   # token 0, after layer 0: guess expert 1 of layer 1 (right)
    look[1, 0, 3] = 1.0   # token 1: guess 3 (wrong: routed to 2)
    look[2, 0, 1] = 1.0   # token 2: guess 1 (right)
    return make_trace([[[0], [1]], [[0], [2]], [[0], [1]]], num_experts=4, lookahead=look)


def test_hand_timeline() -> None:
    """One lane, 1000 us per load, 100 us per layer, 50 us per expert, one expert per layer.

    Token 0: layer 0 misses expert 0 (loaded 100..1100, computed by 1150); after its accesses the
    lookahead prefetches layer 1's expert 1, queued behind the demand load: 1100..2100. Layer 1,
    routed at 1250, finds it in flight (late) and computes 2100..2150.
    Token 1: layer 0 hits (2250..2300); the wrong guess 3 evicts expert 1 (used) and loads
    2250..3250. Layer 1, routed at 2400, misses expert 2: its one slot holds 3 in flight, which
    cannot be withdrawn, so the demand load waits for room until 3 lands, evicts it unused
    (wasted) and loads 3250..4250; computed by 4300.
    Token 2: layer 0 hits (4400..4450); the guess 1 evicts 2 and loads 4400..5400; layer 1 is
    late on it and ends at 5450."""
    eng = _assert_same(_hand_trace(), budget=2)
    c = eng.state.steps.columns()
    us = [round(x * 1e6, 6) for x in c["t_end"]]
    assert us == [1150.0, 2150.0, 2300.0, 4300.0, 4450.0, 5450.0]
    assert c["late"].tolist() == [0, 1, 0, 0, 0, 1]
    assert c["misses"].tolist() == [1, 0, 0, 1, 0, 0]
    assert c["prefetch_bytes"].tolist() == [3_000_000, 0, 3_000_000, 0, 3_000_000, 0]
    assert c["evictions"].tolist() == [0, 0, 1, 1, 1, 0]
    assert [round(x * 1e6, 6) for x in c["stall_s"]] == [1000.0, 850.0, 0.0, 1850.0, 0.0, 850.0]
    m = compute_metrics(eng.state)
    st = eng.state.stats
    assert (st.prefetch_units, st.prefetch_used, st.fetch_needed, st.fetch_covered) == (3, 2, 4, 2)
    assert st.wasted_prefetch_bytes == 3_000_000   # the wrong guess 3, evicted unused
    assert m["sim_time_s"] == pytest.approx(5450e-6)


@pytest.mark.parametrize("kw, why", [
    ({"record_timeline": True}, "timeline"),
    ({"check_invariants": True}, "invariant"),
    ({"swap_out": True}, "swap_out"),
    ({"buffer_bytes": 3_000_000}, "buffer"),
    ({"sync_prefetch": True}, "sync_prefetch"),
    ({"hw": tiny_hw(copy_engines=2)}, "copy engine"),
])
def test_refusals_are_reported(kw: dict[str, Any], why: str) -> None:
    """Runs the kernel does not reproduce take the fast path's driver; the kernel says why."""
    eng, m = _run(_hand_trace(), fast=True, budget=2, **kw)
    assert eng.state.path == "fast" and m["engine_path"] == "fast"
    why_not = prefetch_refusal(eng.state)
    assert why_not is not None and why in why_not
