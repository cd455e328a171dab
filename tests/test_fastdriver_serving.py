"""Serving runs (requests arriving over time: sim/engine/scheduler.py) on the SimPy-free driver
(sim/fast/driver.py) against the SimPy event loop: the same metrics, step records, timeline and
scheduler times (admission, first token, finish), bit for bit, for every registered policy but
the oracle bounds (a serving scenario refuses them: they read a future the scheduler forms as it
goes), on random traces and random arrival traces
(Poisson, bursts of equal arrivals, idle gaps longer than the work), static and continuous
batching, with and without a modelled KV cache, and the hardware knobs of
``tests/test_fastdriver.py``. The kernels never take a serving run: the driver does."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.registry import make_policy, policy_names
from moesim.sim.config.catalog import get_runtime
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.arrivals import Arrivals
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.serving_workload import serving_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.test_context import attn_model
from tests.util import assert_same_replays, random_trace, tiny_hw, tiny_model

POLICIES = sorted(p for p in policy_names() if not make_policy(p).oracle)
EXAMPLES = int(os.environ.get("MOESIM_FASTDRIVER_EXAMPLES", "120"))


def _arrivals(rng: np.random.Generator, n: int, kind: str, work_s: float) -> Arrivals:
    """``n`` arrival times: Poisson at about one request per ``work_s`` (the time one iteration
    may take), bursts of equal times, or gaps far longer than the work (the GPU idles)."""
    if kind == "poisson":
        gaps = rng.exponential(work_s, n)
    elif kind == "bursts":
        gaps = rng.choice([0.0, 0.0, work_s * 3], n)
    else:
        gaps = rng.uniform(10 * work_s, 20 * work_s, n)
    gaps[0] = rng.choice([0.0, work_s])   # the first request at 0, or after an idle start
    return Arrivals(np.cumsum(gaps))


def _serve(policy: str, *, fast: bool, trace: Any, arrivals: Arrivals, kind: str, max_batch: int, max_tokens: int,
           kv: bool, budget: int, hw: Any, runtime: Any, initial: str, seed: int, order: str, buffer: int,
           sync: bool, timeline: bool, swap: bool, check: bool = True) -> tuple[Engine, dict[str, Any]] | str:
    m = trace.model
    model = attn_model(m.num_layers, m.num_experts, m.top_k) if kv else tiny_model(m.num_layers, m.num_experts,
                                                                                 m.top_k)
    try:
        wl = serving_workload(trace, sorted(set(trace.request_id.tolist())), ("prefill", "decode"), arrivals,
                              kind=kind, max_batch=max_batch, max_tokens=max_tokens, context_tokens=0,
                              kv_modelled=kv)
        eng = Engine(wl, make_policy(policy), CostModel(model, hw, get_runtime(runtime)),
                     budget_bytes=budget * model.expert_bytes, seed=seed, initial=initial, pcie_order=order,
                     buffer_bytes=buffer * model.expert_bytes, sync_prefetch=sync, record_timeline=timeline,
                     swap_out=swap, check_invariants=check, fast_replay=FAST_PATH if fast else None)
        eng.run()
    except MoesimError as exc:   # a run the policy cannot make (both paths must say the same)
        return f"{type(exc).__name__}: {exc}"
    return eng, compute_metrics(eng.state)


def _same(slow: tuple[Engine, dict[str, Any]] | str, fast: tuple[Engine, dict[str, Any]] | str) -> None:
    """The two replays of one serving run agree bit for bit (the driver took it)."""
    if isinstance(slow, str) or isinstance(fast, str):
        assert isinstance(slow, str) and slow == fast, (slow, fast)
        return
    (se, ms), (fe, mf) = slow, fast
    assert se.state.path == "event"
    assert fe.state.path == "fast", fe.state.path_reason   # the driver: no kernel takes a serving run
    assert_same_replays(se, ms, fe, mf)
    assert fe.state.timeline == se.state.timeline
    a, b = se.state.scheduler, fe.state.scheduler
    assert a is not None and b is not None
    for name in ("admitted", "first_token", "finish", "tokens_out"):
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
    assert (b.count, b.tokens, b.finished, b.live_kv_peak) == (a.count, a.tokens, a.finished, a.live_kv_peak)
    assert fe.state.stats.token_end == se.state.stats.token_end
    assert fe.state.stats.request_start == se.state.stats.request_start
    assert fe.state.now() == se.state.now()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=hs.sampled_from(POLICIES),
    layers=hs.integers(1, 3), experts=hs.integers(2, 8), top_k=hs.integers(1, 2),
    requests=hs.integers(1, 3), prompt=hs.integers(0, 3), decode=hs.integers(1, 4), n=hs.integers(1, 8),
    arrive=hs.sampled_from(["poisson", "bursts", "idle"]), kind=hs.sampled_from(["static", "continuous"]),
    max_batch=hs.integers(1, 3), max_tokens=hs.integers(3, 6), kv=hs.booleans(),
    slots=hs.integers(1, 5), lanes=hs.integers(1, 3), order=hs.sampled_from(["priority", "priority", "fifo"]),
    gbps=hs.sampled_from([0.3, 3.0, 30.0]), evict_us=hs.sampled_from([0.0, 0.0, 5.0]),
    layer_us=hs.sampled_from([0.0, 100.0, 1000.0]), expert_us=hs.sampled_from([0.0, 50.0, 500.0]),
    demand_load_us=hs.sampled_from([0.0, 0.0, 20.0]), issue_us=hs.sampled_from([0.0, 0.0, 10.0]),
    initial=hs.sampled_from(["empty", "random", "popular"]), buffer=hs.sampled_from([0, 0, 1]),
    sync=hs.sampled_from([False, False, True]), timeline=hs.booleans(), swap=hs.sampled_from([False, False, True]),
    seed=hs.integers(0, 10**6),
)
def test_driver_serves_as_the_event_loop(policy: str, layers: int, experts: int, top_k: int, requests: int,
                                         prompt: int, decode: int, n: int, arrive: str, kind: str, max_batch: int,
                                         max_tokens: int, kv: bool, slots: int, lanes: int, order: str, gbps: float,
                                         evict_us: float, layer_us: float, expert_us: float, demand_load_us: float,
                                         issue_us: float, initial: str, buffer: int, sync: bool, timeline: bool,
                                         swap: bool, seed: int) -> None:
    top_k = min(top_k, experts)
    trace = random_trace(seed, layers=layers, experts=experts, top_k=top_k, requests=requests, prompt=prompt,
                         decode=decode)
    rng = np.random.default_rng(seed)
    # round work figures: arrivals (bursts) and copies land on the instants compute ends
    work_s = layers * (layer_us + top_k * expert_us + 1000.0) * 1e-6
    kw: dict[str, Any] = {
        "trace": trace, "arrivals": _arrivals(rng, n, arrive, work_s), "kind": kind, "max_batch": max_batch,
        "max_tokens": max_tokens, "kv": kv, "budget": layers * slots,
        "hw": tiny_hw(copy_engines=lanes, pcie_gbps=gbps, evict_us=evict_us, layer_us=layer_us,
                      expert_us=expert_us),
        "runtime": {"name": "t", "demand_load_us": demand_load_us, "prefetch_issue_us": issue_us},
        "initial": initial, "seed": seed, "order": order, "buffer": buffer, "sync": sync, "timeline": timeline,
        "swap": swap}
    _same(_serve(policy, fast=False, **kw), _serve(policy, fast=True, **kw))


def test_an_arrival_due_when_a_copy_lands_orders_as_the_event_loop() -> None:
    # the second request arrives exactly when the first one's iteration ends and while a
    # prefetch (mixtral-offloading's) is still in flight: the idle-free hand-over and the
    # landing at the idle GPU's wake-up instant must order as SimPy orders them
    trace = random_trace(3, layers=2, experts=4, top_k=2, requests=2, prompt=1, decode=2)
    kw: dict[str, Any] = {
        "trace": trace, "kind": "continuous", "max_batch": 2, "max_tokens": 4, "kv": False, "budget": 4,
        "hw": tiny_hw(layer_us=1000.0, expert_us=500.0), "runtime": {"name": "t"}, "initial": "empty", "seed": 0,
        "order": "priority", "buffer": 0, "sync": False, "timeline": True, "swap": False}
    first = _serve("mixtral-offloading", fast=False, arrivals=Arrivals(np.array([0.0, 1.0])), **kw)
    assert not isinstance(first, str)
    ends = first[0].state.stats.iteration_end
    for t in (ends[0], ends[0] + 1e-3, ends[-1], ends[-1] + 2e-3):   # on an iteration's end, and idle after
        arrivals = Arrivals(np.array([0.0, t]))
        _same(_serve("mixtral-offloading", fast=False, arrivals=arrivals, **kw),
              _serve("mixtral-offloading", fast=True, arrivals=arrivals, **kw))


def test_no_kernel_takes_a_serving_run() -> None:
    # lru (the cache kernel's) and mixtral-offloading (the next-layer prefetch kernel's) on runs
    # that a kernel would take but for the arrivals: the driver takes them, as the event loop
    trace = random_trace(5, layers=2, experts=8, top_k=2, requests=3, prompt=2, decode=4)
    kw: dict[str, Any] = {
        "trace": trace, "arrivals": Arrivals(np.array([0.0, 0.002, 0.002, 0.05])), "kind": "continuous",
        "max_batch": 2, "max_tokens": 4, "kv": False, "budget": 8, "hw": tiny_hw(), "runtime": {"name": "t"},
        "initial": "popular", "seed": 1, "order": "priority", "buffer": 0, "sync": False, "timeline": False,
        "swap": False, "check": False}
    for policy in ("lru", "mixtral-offloading"):
        _same(_serve(policy, fast=False, **kw), _serve(policy, fast=True, **kw))
