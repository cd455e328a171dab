"""The calibration's fits and measurement discipline, without torch: the anchored line, the best of
rounds, the demand-load cost derived through the simulator, what a validation calibrates on,
and the idle-class busy loops that keep processors awake."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from moesim.sim.config.catalog import get_model
from moesim.sim.real.calibration.awake import can_keep_awake, cpus_awake
from moesim.sim.real.calibration.executor_runs import (
    calibration_workload,
    demand_load_cost,
    prefetch_issue_cost,
    simulated_run,
    simulated_tpot,
)
from moesim.sim.real.calibration.timing import best_of, fit_anchored

ROOT = Path(__file__).resolve().parents[1]


def test_anchored_fit_is_exact_at_the_first_point() -> None:
    """Decode's one token is met exactly; the slope is the least-squares slope about it."""
    a, b = fit_anchored([0, 1, 3, 7], [200.0, 260.0, 280.0, 330.0])
    assert a == 200.0
    # slope = sum(dx * dy) / sum(dx^2) about (0, 200): (60 + 240 + 910) / (1 + 9 + 49)
    assert b == pytest.approx(1210 / 59)
    assert fit_anchored([1, 2], [5.0, 4.0]) == (5.0, 0.0)   # a time cannot fall with tokens
    assert fit_anchored([3], [7.0]) == (7.0, 0.0)


def test_best_of_takes_each_points_lowest_round() -> None:
    rounds = [[{"n": 1, "s": 3.0}, {"n": 2, "s": 5.0}], [{"n": 2, "s": 4.0}, {"n": 1, "s": 9.0}]]
    assert best_of(rounds, ("n",), ("s",)) == [{"n": 1, "s": 3.0}, {"n": 2, "s": 4.0}]


HW = {"name": "cal", "vram_gib": 1, "pcie_gbps": 10.0, "pcie_latency_us": 30.0, "peak_tflops": 1, "hbm_gbps": 10,
      "copy_engines": 1, "kernel_us": 0.0,
      "costs": {"layer_us": 200.0, "expert_us": 70.0, "expert_us_per_token": 1.0, "head_us": 30.0}}
RT = {"name": "cal", "layer_us": 150.0, "iteration_us": 300.0, "token_us": 2.0}


def test_demand_load_cost_makes_the_simulator_reproduce_the_measured_gap() -> None:
    """The defining property: with the derived demand_load_us, the simulator's TPOT difference
    between the all-demand and the all-resident run is the measured one."""
    spec = get_model("tiny-moe")
    wl = calibration_workload(spec, None, context=8, tokens=6, seed=1)
    res = simulated_tpot(spec, wl, "resident", HW, dict(RT, demand_load_us=0.0), 1)
    dem = simulated_tpot(spec, wl, "demand", HW, dict(RT, demand_load_us=0.0), 1)
    measured_gap = (dem - res) + 8 * 45e-6     # 45 us per demand load beyond the model (8 per step)
    runs = {"seed": 1, "resident_s": res, "demand_s": res + measured_gap}
    fit = demand_load_cost(spec, wl, runs, HW, dict(RT, demand_load_us=0.0))
    assert fit["loads_per_step"] == 8 and fit["demand_load_us"] == pytest.approx(45.0)
    with_cost = dict(RT, demand_load_us=fit["demand_load_us"])
    gap = simulated_tpot(spec, wl, "demand", HW, with_cost, 1) - simulated_tpot(spec, wl, "resident", HW, with_cost, 1)
    assert gap == pytest.approx(measured_gap, rel=1e-9)
    # a measured gap below the model's is clipped at 0, not a negative cost
    low = demand_load_cost(spec, wl, dict(runs, demand_s=res), HW, dict(RT, demand_load_us=0.0))
    assert low["demand_load_us"] == 0.0


def test_prefetch_issue_cost_makes_the_simulator_reproduce_the_measured_gap() -> None:
    """The defining property: with the fitted prefetch_issue_us, the simulator's TPOT difference
    between the prefetch run (oracle-prefetch, one layer's experts per pool) and the resident
    run is the measured one; the prefetches arrive in time, so without a cost the simulator
    predicts no difference at all."""
    spec = get_model("tiny-moe")
    wl = calibration_workload(spec, None, context=8, tokens=6, seed=1)
    rt = dict(RT, demand_load_us=40.0)
    res = simulated_tpot(spec, wl, "resident", HW, rt, 1)
    pre, issued = simulated_run(spec, wl, "prefetch", HW, rt, 1)
    assert issued > 0 and pre == pytest.approx(res, rel=1e-12)
    runs = {"seed": 1, "resident_s": res, "prefetch_s": res + 400e-6}
    fit = prefetch_issue_cost(spec, wl, runs, HW, rt)
    assert fit["predicted_gap_us"] == pytest.approx(0.0, abs=1e-6) and fit["prefetch_issue_us"] > 0
    with_cost = dict(rt, prefetch_issue_us=fit["prefetch_issue_us"])
    gap = simulated_tpot(spec, wl, "prefetch", HW, with_cost, 1) - simulated_tpot(spec, wl, "resident", HW, with_cost, 1)
    assert gap == pytest.approx(400e-6, rel=1e-6)
    # a measured gap the model already explains gives no cost
    assert prefetch_issue_cost(spec, wl, dict(runs, prefetch_s=res), HW, rt)["prefetch_issue_us"] == 0.0


def test_prefetch_issue_cost_where_the_copies_set_the_step_is_the_share_of_the_excess() -> None:
    """Copies far slower than a layer (as real-shaped Mixtral experts over PCIe): the prefetches
    cannot land in time, the simulated step hardly responds to an issue cost, and bisection
    would put a small measured excess on a huge per-prefetch cost (5.65 ms on an H100); the
    fit takes each prefetch's share of the excess instead and says so."""
    spec = get_model("tiny-moe")
    wl = calibration_workload(spec, None, context=8, tokens=6, seed=1)
    slow = dict(HW, pcie_gbps=0.05)
    rt = dict(RT, demand_load_us=0.0)
    res = simulated_tpot(spec, wl, "resident", slow, rt, 1)
    pre, issued = simulated_run(spec, wl, "prefetch", slow, rt, 1)
    assert pre > 2 * res   # copy-bound
    runs = {"seed": 1, "resident_s": res, "prefetch_s": pre + 200e-6}
    fit = prefetch_issue_cost(spec, wl, runs, slow, rt)
    share = 200.0 / fit["prefetches_per_step"]
    assert fit["copy_bound"] and fit["bisection_us"] > 10 * share
    assert fit["prefetch_issue_us"] == pytest.approx(share, rel=1e-6)


def test_validation_calibrates_on_requests_it_does_not_validate() -> None:
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.real.validate import calibration_inputs
    from moesim.sim.run.runner import load_trace

    scen = ROOT / "scenarios/validate-cpu.yaml"
    loaded = load_scenario(scen)                     # validates requests 0 and 1 of 12
    trace = load_trace(loaded)
    context, routing = calibration_inputs(loaded, trace)
    assert routing is not None and routing[1] == [10, 11]
    assert 160 <= context <= 240                      # their decode positions: 130-160 prompt + 79 decoded
    everything = load_scenario(scen, ["workload.requests=all"])
    context, routing = calibration_inputs(everything, trace)
    assert routing is None and context > 100          # nothing to spare: random routing at their context


@pytest.mark.skipif(not can_keep_awake(), reason="SCHED_IDLE busy loops are Linux-only")
def test_cpus_awake_runs_idle_class_loops_and_stops_them() -> None:
    with cpus_awake() as on:
        assert on
        time.sleep(0.3)
        kids = _children()
        assert len(kids) == (os.cpu_count() or 1)
        assert all(os.sched_getscheduler(p) == os.SCHED_IDLE for p in kids)
    assert not _children()
    with cpus_awake(False) as on:
        assert not on and not _children()


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z" and sys.executable.encode() in cmd:
                out.append(int(d.name))
    return out
