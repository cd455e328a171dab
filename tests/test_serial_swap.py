"""``cache.serial_swap``: demand misses swap one at a time (evict-then-fetch), as ActiveEvict's
on-demand baseline does (Fig. 3(a); its blocking I/O equals its total I/O in Table 3), against
the default, where the next copy-back runs beside the previous demand load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moesim.policies.baselines.caching import LRU
from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.run.metrics import compute_metrics
from tests.util import make_trace, steps, tiny_hw, tiny_model


def _run(serial: bool) -> tuple[Engine, dict[str, Any]]:
    # one layer, 4 experts, top-2, room for 2; 10 ms per copy each way, 1 ms attention and expert.
    # Token 0 loads e0 and e1 into free room; token 1 routes e2 and e3: two misses, two swaps.
    tr = make_trace([[[0, 1]], [[2, 3]]], num_experts=4)
    model = tiny_model(1, 4, 2)
    hw = tiny_hw(pcie_gbps=0.3, d2h_gbps=0.3, layer_us=1000, expert_us=1000)
    eng = Engine(build_workload(tr, batch_size=1, phases=("decode",)), LRU(), CostModel(model, hw),
                 budget_bytes=2 * model.expert_bytes, swap_out=True, serial_swap=serial,
                 check_invariants=True)
    eng.run()
    return eng, compute_metrics(eng.state)


def test_pipelined_swaps_overlap_the_second_copy_back_with_the_first_load() -> None:
    eng, m = _run(False)
    # token 0 (free room): H2D(e0) 1-11, H2D(e1) 11-21 while e0 computes, stalls 10 + 9.
    # token 1: attention 22-23; D2H(e0) 23-33; H2D(e2) 33-43 beside D2H(e1) 33-43; e2 computes
    # 43-44; H2D(e3) 44-54; e3 computes 54-55: stalls 20 + 10
    assert [round(s.t_end * 1e3, 6) for s in steps(eng)] == [22, 55]
    assert m["blocking_io_ms"] == pytest.approx(19 + 30)
    assert m["io_busy_ms"] == pytest.approx(20 + 40)


def test_serial_swaps_put_every_copy_on_the_critical_path() -> None:
    eng, m = _run(True)
    # token 1: D2H(e0) 23-33, H2D(e2) 33-43, then (e2 computes 43-44) D2H(e1) 44-54, H2D(e3) 54-64
    assert [round(s.t_end * 1e3, 6) for s in steps(eng)] == [22, 65]
    assert m["d2h_gb"] == pytest.approx(2 * 0.003) and m["demand_gb"] == pytest.approx(4 * 0.003)
    assert m["io_busy_ms"] == pytest.approx(20 + 40)
    assert m["blocking_io_ms"] == pytest.approx(19 + 40)   # every copy of token 1 blocks


def test_serial_swap_needs_swap_out() -> None:
    data = {"name": "t", "trace": {"synthetic": {"model": "mixtral-8x7b", "requests": 1, "prompt_len": 4,
                                                 "decode_len": 4}},
            "model": "mixtral-8x7b", "hardware": "a100-80gb", "policy": "lru",
            "cache": {"experts_per_layer": 4, "serial_swap": True}}
    with pytest.raises(MoesimError, match="serial_swap needs swap_out"):
        load_scenario_data(data, source="t", base_dir=Path("."))
