"""The GPU stream's loop (sim/engine/layer_loop.py) under its two interpreters: the event loop's
SimPy waits (sim/engine/gpu.py) and the driver's clock (sim/fast/copies.py) must be asked for the
same waits, in the same order, at the same instants (a finer check than equal step records:
every compute interval, landing, room and host-time wait of the run), and the driver's clock
must never suspend the stream."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

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
