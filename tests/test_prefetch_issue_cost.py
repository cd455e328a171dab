"""``runtime.prefetch_issue_us``: the host-side cost of issuing a prefetch, charged on the GPU
stream at the next hook boundary while the copy starts at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import RuntimeSpec
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.kernel_choice import prefetch_refusal
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import make_trace, tiny_hw, tiny_model

TOKENS = [[[0]], [[1]], [[2]], [[3]]]   # one layer, four experts, top-1: every token a new expert


def _run(issue_us: float, *, policy: str = "oracle-prefetch", timeline: bool = False,
         experts: list[list[list[int]]] = TOKENS, check: bool = True) -> tuple[Engine, dict[str, Any]]:
    trace = make_trace(experts, num_experts=4)
    m = trace.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    wl = build_workload(trace, batch_size=1, phases=["decode"])
    # 30 GB/s: a 3 MB expert loads in 100 us; layer 100 us, expert 50 us
    cost = CostModel(model, tiny_hw(pcie_gbps=30.0), RuntimeSpec(name="t", prefetch_issue_us=issue_us))
    eng = Engine(wl, make_policy(policy), cost, budget_bytes=2 * model.expert_bytes, check_invariants=check,
                 record_timeline=timeline, fast_replay=FAST_PATH)
    eng.run()
    return eng, compute_metrics(eng.state)


def _durations(eng: Engine) -> list[float]:
    ends = np.asarray(eng.state.steps.columns()["t_end"]) * 1e6
    return list(np.round(np.diff(np.concatenate([[0.0], ends])), 6))


def test_exact_timeline_with_issue_cost() -> None:
    """Two slots, oracle next-token prefetch, 30 us per prefetch issued.
    Token 0: layer 0-100, demand load of expert 0 100-200, expert 1 prefetched behind it (200-300);
    the 30 us of issuing it (100-130) hide under the wait; expert 0 computes 200-250.
    Tokens 1 and 2: layer 100 us, expert hit (landed), the next prefetch issued: 30 us, then
    50 us of expert: 180 us. Token 3: nothing left to prefetch: 150 us."""
    eng, m = _run(30.0)
    assert _durations(eng) == [250.0, 180.0, 180.0, 150.0]
    assert m["hits"] == 3 and m["misses"] == 1
    # the issue cost is runtime overhead, not policy CPU time: 3 prefetches x 30 us
    assert m["runtime_overhead_ms"] == pytest.approx(0.09)
    assert m["policy_cpu_ms"] == 0.0


def test_without_issue_cost() -> None:
    """The same run at the default 0: tokens 1-3 take layer + expert (150 us)."""
    eng, m = _run(0.0)
    assert _durations(eng) == [250.0, 150.0, 150.0, 150.0]
    assert m["runtime_overhead_ms"] == 0.0


def test_zero_cost_is_bit_identical_and_demand_only_unaffected() -> None:
    """Default 0 changes nothing, and a policy that never prefetches pays nothing."""
    a = _run(0.0)[1]
    b = _run(0.0)[1]
    assert a == b
    lru0, lru1 = _run(0.0, policy="lru")[1], _run(500.0, policy="lru")[1]
    lru0.pop("engine_path"), lru1.pop("engine_path")
    lru0.pop("engine_path_reason")   # why the event loop ran, where it did
    lru1.pop("engine_path_reason")   # why the event loop ran, where it did
    assert lru0 == lru1


def test_timeline_shows_the_issue_cost() -> None:
    """The timeline has the issue cost on the host's runtime lane."""
    eng, _ = _run(30.0, timeline=True)
    issues = [e for e in eng.state.timeline if e[0] == "CPU runtime"]
    assert [(round(e[2] * 1e6, 6), round(e[3] * 1e6, 6)) for e in issues] == [(100.0, 30.0), (350.0, 30.0), (530.0, 30.0)]


def test_prefetch_kernel_leaves_issue_costs_to_the_driver() -> None:
    """The prefetch kernel replays the run without a cost (same timeline) and hands a run with
    one to the SimPy-free driver, which charges it as the event loop does."""
    fast, m = _run(0.0, check=False)
    assert m["engine_path"] == "fast (oracle-prefetch kernel)"
    assert _durations(fast) == [250.0, 150.0, 150.0, 150.0]
    slow, _ = _run(30.0, check=False)
    assert slow.state.path == "fast" and "prefetch_issue_us" in (prefetch_refusal(slow.state) or "")
    assert _durations(slow) == [250.0, 180.0, 180.0, 150.0]
