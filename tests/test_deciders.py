"""Every shipped cache rule's decider (policies/parts/deciders/) on the cache kernel against the
event loop, on a trace that makes every rule evict: one token and two tokens per iteration
(several misses beside hits in one layer), one and two copy lanes, costs whose round figures
make loads land at the instant compute ends (ties resolve as SimPy's). Same metrics and step
records, and the kernel is the one that ran."""

from __future__ import annotations

from typing import Any

import pytest

from moesim.policies.contract.registry import make_policy
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import assert_same_replays, random_trace, tiny_hw, tiny_model

RULES = ("lru", "fifo", "lfu", "random", "belady", "static")


def _run(rule: str, *, fast: bool, batch: int, lanes: int) -> tuple[Engine, dict[str, Any]]:
    tr = random_trace(11, layers=2, experts=10, top_k=3, requests=4, prompt=0, decode=10, locality=0.5)
    m = tr.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    # static stages one iteration's experts beside its static set (the kernel's condition)
    params = {"staging_experts": batch * m.top_k} if rule == "static" else None
    eng = Engine(build_workload(tr, batch_size=batch, phases=["decode"]), make_policy(rule, params),
                 CostModel(model, tiny_hw(copy_engines=lanes, evict_us=5.0, expert_us=500.0)),
                 budget_bytes=14 * model.expert_bytes, seed=3,
                 initial="popular" if rule == "static" else "empty",
                 fast_replay=FAST_PATH if fast else None)
    eng.run()
    return eng, compute_metrics(eng.state)


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("rule", RULES)
def test_each_decider_on_the_kernel_equals_the_event_loop(rule: str, batch: int, lanes: int) -> None:
    slow, ms = _run(rule, fast=False, batch=batch, lanes=lanes)
    fast, mf = _run(rule, fast=True, batch=batch, lanes=lanes)
    assert fast.state.path == f"fast ({rule} kernel)", fast.state.path_reason
    assert_same_replays(slow, ms, fast, mf)
    assert mf["evictions"] > 0
