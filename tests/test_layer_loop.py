"""The GPU stream's loop (sim/engine/layer_loop.py) under its two interpreters: the event loop's
SimPy waits (sim/engine/gpu.py) and the driver's clock (sim/fast/copies.py) must be asked for the
same waits, in the same order, at the same instants (a finer check than equal step records:
every compute interval, landing, room and host-time wait of the run), and the driver's clock
must never suspend the stream. A hand-made case pins the clock's resume behind same-instant
landings when the GPU waits for one queued copy (Clock.land_one), which the random cases miss."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moesim.policies.contract.base import Context, Plan, Policy, Routing, UnitKey, View
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_runtime
from moesim.sim.engine import event_loop, layer_loop
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.gpu import SimPyWaits
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast import driver, path
from moesim.sim.fast.path import FAST_PATH
from tests.util import make_trace, tiny_hw, tiny_model


class Recorder:
    """Waits that log each request (its name, the clock when asked, its argument) and pass it on."""

    def __init__(self, inner: Any, clk: Any, log: list[tuple[Any, ...]]) -> None:
        self.inner, self.clk, self.log = inner, clk, log

    def run_for(self, dt: float) -> Any:
        self.log.append(("run_for", self.clk._now, dt))
        return self.inner.run_for(dt)

    def land_one(self, u: Any) -> Any:
        self.log.append(("land_one", self.clk._now, u.key))
        return self.inner.land_one(u)

    def land_any(self, units: list[Any]) -> Any:
        self.log.append(("land_any", self.clk._now, [u.key for u in units]))
        return self.inner.land_any(units)

    def land_all(self, units: list[Any]) -> Any:
        self.log.append(("land_all", self.clk._now, [u.key for u in units]))
        return self.inner.land_all(units)

    def room(self) -> Any:
        self.log.append(("room", self.clk._now, None))
        return self.inner.room()


def _waits(policy: str, seed: int, *, fast: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The waits one run asks for, on the event loop or (``fast``) the driver."""
    log: list[tuple[Any, ...]] = []
    if fast:
        monkeypatch.setattr(path, "kernel_of", lambda state: None)   # the driver, never a kernel
        monkeypatch.setattr(driver, "gpu_stream",
                            lambda run, clk, waits: layer_loop.gpu_stream(run, clk, Recorder(waits, clk, log)))
    else:
        monkeypatch.setattr(event_loop, "gpu_process", lambda run, env: layer_loop.gpu_stream(
            run, env, Recorder(SimPyWaits(env, run.transfers), env, log)))
    rng = np.random.default_rng(seed)
    layers, experts, k = 3, 6, 2
    ex = np.stack([np.stack([rng.choice(experts, k, replace=False) for _ in range(layers)]) for _ in range(12)])
    trace = make_trace(ex, num_experts=experts, requests=[0] * 6 + [1] * 6,
                       lookahead=rng.normal(size=(12, layers, experts)).astype(np.float16))
    # round costs: copies land exactly when compute ends, so ties decide the order of waits
    hw = tiny_hw(copy_engines=1 + seed % 2, pcie_gbps=3.0, evict_us=5.0 * (seed % 2), layer_us=1000.0,
                 expert_us=500.0)
    runtime = {"name": "t", "demand_load_us": 20.0, "prefetch_issue_us": 10.0 * (seed % 2)}
    eng = Engine(build_workload(trace, batch_size=2, phases=["prefill", "decode"]), make_policy(policy),
                 CostModel(tiny_model(layers, experts, k), hw, get_runtime(runtime)),
                 budget_bytes=layers * 2 * tiny_model(layers, experts, k).expert_bytes, seed=seed,
                 sync_prefetch=seed == 2, check_invariants=True, fast_replay=FAST_PATH if fast else None)
    eng.run()
    assert eng.state.path == ("fast" if fast else "event"), eng.state.path_reason
    log.append(("end", eng.state.now(), None))
    return log


@pytest.mark.parametrize("policy", ["lru", "mixtral-offloading", "fmoe", "promoe-style", "moepic", "buddymoe"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_interpreters_ask_the_same_waits(policy: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = _waits(policy, seed, fast=False, monkeypatch=monkeypatch)
    fast = _waits(policy, seed, fast=True, monkeypatch=monkeypatch)
    assert any(w[0] != "run_for" for w in slow), "the case waits for no copy: it checks too little"
    assert fast == slow


class _QueuedWait(Policy):
    """Expert 0 loaded with the model; at routing, copies experts 1, 2, 3 and 4 (two lanes: 1 and
    2 start, 3 and 4 queue) and waits for 3; logs at the layer's end when it ends and whether 4,
    whose copy lands at the same instant as 3's, is resident."""

    name = "queued-wait"

    def __init__(self) -> None:
        self.log: list[tuple[float, bool]] = []

    def preload(self, ctx: Context) -> list[UnitKey]:
        return [(0, 0, 0)]

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        for e in (1, 2, 3, 4):
            view.prefetch(layer, e)
        return Plan(routing.experts.copy(), wait_for=(3,))

    def on_layer_end(self, view: View, layer: int) -> None:
        self.log.append((round(view.now * 1e6, 6), view.is_resident(layer, 4)))


@pytest.mark.parametrize("fast", [False, True])
def test_a_wait_for_a_queued_copy_resumes_behind_that_instants_landings(fast: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # attention 0..100 us; routed to expert 0 (resident): computed 100..150. The copies of 1 and 2
    # run 100..1100 on the two lanes; 3 and 4 queue, then run 1100..2100, 3's transfer created
    # first. At 150 the layer waits for 3 alone (land_one), queued: the GPU resumes through an
    # event the landing succeeds, scheduled behind 4's landing at 2100, so the layer ends with 4
    # resident (a GPU resumed by 3's own transfer would see 4 still in flight)
    log: list[tuple[Any, ...]] = []
    if fast:
        monkeypatch.setattr(path, "kernel_of", lambda state: None)
        monkeypatch.setattr(driver, "gpu_stream",
                            lambda run, clk, waits: layer_loop.gpu_stream(run, clk, Recorder(waits, clk, log)))
    else:
        monkeypatch.setattr(event_loop, "gpu_process", lambda run, env: layer_loop.gpu_stream(
            run, env, Recorder(SimPyWaits(env, run.transfers), env, log)))
    pol = _QueuedWait()
    model = tiny_model(1, 6, 1)
    eng = Engine(build_workload(make_trace([[[0]]], num_experts=6), batch_size=1, phases=["decode"]), pol,
                 CostModel(model, tiny_hw(copy_engines=2)), budget_bytes=6 * model.expert_bytes,
                 check_invariants=True, fast_replay=FAST_PATH if fast else None)
    eng.run()
    assert eng.state.path == ("fast" if fast else "event")
    us = [(w[0], round(w[1] * 1e6, 6), round(w[2] * 1e6, 6) if w[0] == "run_for" else w[2]) for w in log]
    assert us == [("run_for", 0.0, 100.0), ("run_for", 100.0, 50.0), ("land_one", 150.0, (0, 3, 0))]
    assert pol.log == [(2100.0, True)]
