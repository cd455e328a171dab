"""The executor's own decode step, measured in three runs: every expert resident (no copy at
all), every access a demand load (``no-cache``), and every access covered by a prefetch issued
while the layer before computes (``oracle-prefetch`` with one layer's experts per pool).

The routing of the runs is the decode of requests of a trace recorded from the model (its
natural routing: ``simctl validate`` takes requests of the scenario's trace that it does not
validate) or, without one, uniformly random routing of the model's shape. The routing matters
on a CPU, where a small model's experts stay in the processor's caches when the routing
reuses them: uniformly random routing made the resident step of the bundled tiny MoE ~4%
slower than its recorded routing did.

The resident run fixes the framework overhead per layer (what the executor spends around its
kernels). The difference between it and the demand run is what a demand load costs the executor; the
simulator, given the copy and compute fits, predicts part of it (the copies that the layer's
compute cannot hide). The rest, spread over the demand loads of a step, is the runtime's
``demand_load_us``: on the CPU executor, the hand-off to the copy thread and back (a thread
wake-up on each side, the interpreter lock passing between the two threads, the queue's
bookkeeping); on a GPU, the host blocking on the copy's event and relaunching the layer. In
the same way the prefetch run, against the resident one, gives ``prefetch_issue_us``: what
issuing a prefetch costs the executor's compute thread beyond the copy (the policy's victim
and bookkeeping, the hand-off to the copy thread, and on a CPU the copy thread's wake-ups and
interpreter lock taken from the compute thread while the copy lands). The runs alternate
(resident, demand, prefetch, resident, ...) so that a slow spell of a shared machine falls on
all of them, and each figure is the lowest of its runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.sim.fast.path import FAST_PATH


def random_trace(spec: Any, context: int, tokens: int, seed: int) -> Any:
    """One request of ``context`` prompt tokens and ``tokens`` decode tokens, routed uniformly
    at random (top-k distinct experts per token and layer) on ``spec``'s shape."""
    from moesim.traces.format.trace_file import (
        DECODE,
        PREFILL,
        ModelInfo,
        TraceMeta,
        trace_from_columns,
    )

    L, E, k = spec.num_layers, spec.num_experts, spec.top_k
    rng = np.random.default_rng(seed)
    T = context + tokens
    ex = np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(T)])
    ph = np.array([PREFILL] * context + [DECODE] * tokens)
    cols = {"request_id": np.zeros(T * L, dtype=np.int64), "token_idx": np.repeat(np.arange(T), L),
            "phase": np.repeat(ph, L), "layer": np.tile(np.arange(L), T),
            "experts": ex.reshape(T * L, k).astype(np.int16)}
    return trace_from_columns(cols, TraceMeta(ModelInfo("calibration", L, E, k)))


COPY_BOUND_FACTOR = 10.0
"""A bisected ``prefetch_issue_us`` more than this many times each prefetch's share of the
measured excess means the simulated step is set by the copies, not by the issue cost (met on an
H100 with real-shaped Mixtral experts: 6.7 ms copies behind ~1 ms layers; a 0.48 ms excess per
step bisected to 5.65 ms per prefetch); :func:`prefetch_issue_cost` then takes the share."""

RUNS = {
    # name: (policy, budget in experts per layer (None: all), initial fill)
    "resident": ("lru", None, "popular"),
    "demand": ("no-cache", "top_k", "empty"),
    "prefetch": ("oracle-prefetch", "top_k", "empty"),
}


def _budget(spec: Any, per_layer: Any) -> int:
    if per_layer is None:
        return int(spec.routed_bytes)
    return int(spec.num_layers * spec.top_k * spec.expert_bytes)


def calibration_workload(spec: Any, routing: tuple[Any, list[int]] | None, *, context: int, tokens: int,
                         seed: int) -> Any:
    """The decode iterations of the runs: ``routing = (trace, request ids)``, or None for one
    request of ``context`` + ``tokens`` tokens routed at random. Prompts are untimed context."""
    from moesim.sim.engine.workload import build_workload

    if routing is None:
        return build_workload(random_trace(spec, context, tokens, seed), phases=["decode"])
    trace, requests = routing
    return build_workload(trace, phases=["decode"], requests=list(requests))


def executor_tpot(om: Any, workload: Any, run: str, seed: int) -> dict[str, float]:
    """The executor's TPOT p50 and mean (seconds) and its misses for one of :data:`RUNS`."""
    from moesim.policies.contract.registry import make_policy
    from moesim.sim.config.catalog import get_hardware
    from moesim.sim.engine.cost import CostModel
    from moesim.sim.real.executor.runner import Executor

    policy, per_layer, initial = RUNS[run]
    m = om.spec
    hw = get_hardware({"name": "calibrating", "vram_gib": 1e6, "pcie_gbps": 10, "peak_tflops": 1, "hbm_gbps": 1})
    ex = Executor(workload, make_policy(policy, {}), om, CostModel(m, hw),
                  budget_bytes=_budget(m, per_layer), initial=initial, seed=seed)
    ex.run()
    met = ex.metrics()
    return {"tpot_p50_s": met["tpot_ms"]["p50"] / 1e3, "tpot_mean_s": met["tpot_ms"]["mean"] / 1e3,
            "misses": float(met["misses"]), "late": float(met["late"]), "h2d_gb": float(met["h2d_gb"])}


def simulated_tpot(spec: Any, workload: Any, run: str, hardware: dict[str, Any], runtime: dict[str, Any],
                   seed: int) -> float:
    """The simulator's TPOT p50 (seconds) for the same run with the given profile sections."""
    return simulated_run(spec, workload, run, hardware, runtime, seed)[0]


def simulated_run(spec: Any, workload: Any, run: str, hardware: dict[str, Any], runtime: dict[str, Any],
                  seed: int) -> tuple[float, int]:
    """The simulator's TPOT p50 (seconds) and its prefetches issued, for one of :data:`RUNS`."""
    from moesim.policies.contract.registry import make_policy
    from moesim.sim.config.catalog import get_hardware, get_runtime
    from moesim.sim.engine.cost import CostModel
    from moesim.sim.engine.event_loop import Engine
    from moesim.sim.run.metrics import compute_metrics

    policy, per_layer, initial = RUNS[run]
    cost = CostModel(spec, get_hardware(dict(hardware)), get_runtime(dict(runtime)))
    eng = Engine(workload, make_policy(policy, {}), cost, budget_bytes=_budget(spec, per_layer),
                 initial=initial, seed=seed, fast_replay=FAST_PATH)
    eng.run()
    return float(compute_metrics(eng.state)["tpot_ms"]["p50"]) / 1e3, int(eng.state.stats.prefetch_units)


def measure_runs(om: Any, workload: Any, seed: int, repeats: int) -> dict[str, Any]:
    """Both runs ``repeats`` times, alternating; per run the lowest TPOT p50 (the machine
    undisturbed, as :func:`~moesim.sim.real.calibration.timing.best_of`) and every raw value."""
    raw: dict[str, list[dict[str, float]]] = {name: [] for name in RUNS}
    for _ in range(repeats):
        for name in RUNS:
            raw[name].append(executor_tpot(om, workload, name, seed))
    out: dict[str, Any] = {"seed": seed, "repeats": repeats, "decode_steps": len(workload.iterations), "raw": raw}
    for name, rows in raw.items():
        out[f"{name}_s"] = float(min(r["tpot_p50_s"] for r in rows))
    return out


def demand_load_cost(spec: Any, workload: Any, runs: dict[str, Any], hardware: dict[str, Any],
                     runtime: dict[str, Any]) -> dict[str, float]:
    """``demand_load_us`` such that the simulator's TPOT difference between the two runs equals
    the executor's: the measured difference minus the predicted one (with no demand-load cost),
    per demand load of a decode step (``top_k`` per layer under ``no-cache``). Clipped at 0."""
    zero = dict(runtime, demand_load_us=0.0)
    sim_res = simulated_tpot(spec, workload, "resident", hardware, zero, runs["seed"])
    sim_dem = simulated_tpot(spec, workload, "demand", hardware, zero, runs["seed"])
    per_step = spec.num_layers * spec.top_k
    if per_step <= 0:
        raise MoesimError("calibration: the model has no routed experts")
    measured = runs["demand_s"] - runs["resident_s"]
    predicted = sim_dem - sim_res
    return {"demand_load_us": max(0.0, (measured - predicted) / per_step * 1e6),
            "measured_gap_us": measured * 1e6, "predicted_gap_us": predicted * 1e6,
            "sim_resident_us": sim_res * 1e6, "loads_per_step": float(per_step)}


def prefetch_issue_cost(spec: Any, workload: Any, runs: dict[str, Any], hardware: dict[str, Any],
                        runtime: dict[str, Any]) -> dict[str, float]:
    """``prefetch_issue_us`` such that the simulator's TPOT difference between the ``prefetch``
    run (``oracle-prefetch``, each layer's pool holding one layer's experts: every step's
    experts arrive by prefetch, issued while the previous layer computes) and the resident run
    equals the executor's. The simulator's TPOT p50 grows with the cost (it is charged on the
    GPU stream), so the value is found by bisection; 0 when the measured difference is within
    what the simulator already predicts. Where the copies set the step (the bisected cost over
    :data:`COPY_BOUND_FACTOR` times each prefetch's share of the excess), the share is taken
    and ``copy_bound`` is set. ``runtime`` carries the fitted ``demand_load_us``."""
    measured = runs["prefetch_s"] - runs["resident_s"]
    seed = runs["seed"]
    sim_res = simulated_tpot(spec, workload, "resident", hardware, dict(runtime, prefetch_issue_us=0.0), seed)

    def gap(us: float) -> tuple[float, int]:
        t, n = simulated_run(spec, workload, "prefetch", hardware, dict(runtime, prefetch_issue_us=us), seed)
        return t - sim_res, n

    predicted, issued = gap(0.0)
    steps = max(1, len(workload.iterations))
    out = {"measured_gap_us": measured * 1e6, "predicted_gap_us": predicted * 1e6,
           "prefetches_per_step": issued / steps, "sim_resident_us": sim_res * 1e6}
    if measured <= predicted or issued == 0:
        return dict(out, prefetch_issue_us=0.0)
    lo, hi = 0.0, 2e6 * (measured - predicted) / (issued / steps)
    for _ in range(30):   # the p50 step may carry fewer prefetches than the mean
        if gap(hi)[0] >= measured:
            break
        lo, hi = hi, 2 * hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if gap(mid)[0] < measured:
            lo = mid
        else:
            hi = mid
    share = (measured - predicted) * 1e6 / (issued / steps)
    if hi > COPY_BOUND_FACTOR * share:
        # the simulated step hardly responds to the cost: the copies, not the compute stream,
        # set the step (a prefetch run whose prefetches cannot land in time), so the bisection
        # would put the whole small excess on a cost that the copies hide; take each prefetch's
        # share of the excess instead
        return dict(out, prefetch_issue_us=share, copy_bound=True, bisection_us=hi)
    return dict(out, prefetch_issue_us=hi)
