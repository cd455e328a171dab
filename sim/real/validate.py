"""``simctl validate``: one scenario run twice, in the simulator with a calibrated profile and on
the real executor (:mod:`moesim.sim.real.executor`), and the metrics side by side with the error.

The simulator's model is the executor's model shape (the scenario's model: the bundled trained
tiny MoE for ``model: tiny-moe``, else a random Mixtral of its shape; or ``--model PATH``); its hardware and runtime are the calibration profile measured on
the same device just before (or given with ``--profile``). Both replay the same trace, requests
and budget under fresh instances of the same policy. Hit rates of demand-only policies must be
identical (the executor is teacher-forced and its hit/miss classification is timing-free); the
timings differ by what the simulator does not model and by the machine's noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moesim.sim.config.scenario import LoadedScenario, load_scenario_data
from moesim.sim.core.errors import MoesimError

METRICS: tuple[tuple[str, str], ...] = (
    ("TTFT mean (ms)", "ttft_ms.mean"),
    ("TPOT p50 (ms)", "tpot_ms.p50"),
    ("TPOT mean (ms)", "tpot_ms.mean"),
    ("hit rate", "hit_rate"),
    ("H2D GB", "h2d_gb"),
)


def _get(m: dict[str, Any], path: str) -> float | None:
    cur: Any = m
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return None if cur is None else float(cur)


def error_pct(pred: float | None, meas: float | None) -> float | None:
    """``(pred - meas) / meas`` in percent (None when either is missing or meas is 0)."""
    if pred is None or meas is None or meas == 0:
        return None
    return (pred - meas) / meas * 100.0


def simulate(loaded: LoadedScenario, model_spec: Any, profile: Path, trace: Any) -> dict[str, Any]:
    """The scenario in the simulator with ``profile`` as hardware and runtime and the
    executor's model shape."""
    from moesim.sim.run.runner import run_loaded

    data = loaded.resolved()
    data.update(hardware=str(profile.resolve()), runtime=str(profile.resolve()),
                model=model_spec.model_dump(mode="json"))
    sim = load_scenario_data(data, source=loaded.source, base_dir=loaded.base_dir)
    return run_loaded(sim, trace=trace, steps=False).metrics


def execute(loaded: LoadedScenario, om: Any, profile: Path, trace: Any, *, copy: str = "auto",
            threads: int | None = None) -> dict[str, Any]:
    """The scenario on the executor: the same requests, budget, initial fill and policy. The host's
    torch threads (the model on a CPU, CPU experts on a GPU's host) are ``threads``, by default the
    profile's ``cpu.threads`` (the count its host expert times were measured at), else 1."""
    from moesim.sim.config.catalog import get_hardware, get_runtime, load_spec_file
    from moesim.sim.engine.cost import CostModel
    from moesim.sim.engine.workload import build_workload
    from moesim.sim.real.executor.runner import Executor
    from moesim.sim.run.runner import check_shapes, scenario_policy, select_requests

    scen = loaded.scenario
    source = loaded.source or "scenario"
    if scen.workload.batch_size != 1:
        raise MoesimError(f"{source}: workload.batch_size: the executor replays batch_size 1 only")
    if scen.cache.swap_out:
        raise MoesimError(f"{source}: cache.swap_out: the executor drops evicted experts (no swap-out)")
    if scen.workload.arrivals is not None:
        raise MoesimError(f"{source}: workload.arrivals: the executor replays fixed batches, not requests that arrive")
    check_shapes(trace, om.spec, source)
    policy = scenario_policy(loaded)
    prof, requests = select_requests(loaded, trace)
    wl = build_workload(trace, batch_size=1, phases=scen.workload.phases, requests=requests)
    hw = get_hardware(load_spec_file(profile, "hardware"))
    cost = CostModel(om.spec, hw, get_runtime(load_spec_file(profile, "runtime")))
    if threads is None:
        threads = hw.cpu.threads or 1
    ex = Executor(wl, policy, om, cost, budget_bytes=scen.cache.budget_bytes(om.spec),
                  buffer_bytes=int(round(scen.cache.buffer_experts * om.spec.expert_bytes)),
                  initial=scen.cache.initial, pcie_order=scen.pcie.order, seed=scen.seed,
                  profile=prof, copy=copy, threads=threads)
    ex.run()
    return ex.metrics()


TIMED = ("ttft_ms", "tpot_ms")


def execute_repeated(loaded: LoadedScenario, om: Any, profile: Path, trace: Any, *, repeats: int = 3,
                     copy: str = "auto", threads: int | None = None, keep_awake: bool = True) -> dict[str, Any]:
    """:func:`execute` ``repeats`` times; each timing (TTFT and TPOT statistics, wall time) is
    the best over the runs (lowest time, highest tokens/s): a shared machine only adds time, in
    spells that can cover a whole run, and the calibration measures the machine undisturbed
    the same way. Every run's TPOT p50 and hit rate are kept (``tpot_p50_ms_runs``,
    ``hit_rate_runs``). Counters are the first run's; they agree across runs, even where a layer
    needs more experts than its pool holds, since both sides then compute in the fixed order of
    :func:`moesim.sim.engine.plans.next_in_fixed_order`. On CPU the runs keep every processor awake
    (:mod:`moesim.sim.real.calibration.awake`)."""
    if repeats < 1:
        raise MoesimError(f"--repeats must be >= 1, got {repeats}")
    from moesim.sim.real.calibration.awake import cpus_awake

    with cpus_awake(om.device.type == "cpu" and keep_awake):
        runs = [execute(loaded, om, profile, trace, copy=copy, threads=threads) for _ in range(repeats)]
    return best_of_runs(runs)


def best_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics dict from several executor runs of one scenario: each timing the best of
    them, counters from the first, every run's TPOT p50 and hit rate kept (see
    :func:`execute_repeated`)."""
    out = dict(runs[0])
    for group in TIMED:
        out[group] = {stat: (None if out[group][stat] is None else
                             float(min(r[group][stat] for r in runs))) for stat in out[group]}
    out["wall_s"] = float(min(r["wall_s"] for r in runs))
    out["tokens_per_s"] = float(max(r["tokens_per_s"] for r in runs))
    out["repeats"] = len(runs)
    out["tpot_p50_ms_runs"] = [r["tpot_ms"]["p50"] for r in runs]
    out["hit_rate_runs"] = [r["hit_rate"] for r in runs]
    return out


def calibration_inputs(loaded: LoadedScenario, trace: Any, *, n_requests: int = 2) -> tuple[int, tuple[Any, list[int]] | None]:
    """What the calibration before a validation measures on: ``(context, routing)``.

    The executor-step runs replay the decode of up to ``n_requests`` requests of the scenario's
    trace that the validation does not replay (the last ones), so the calibration sees the
    model's own routing but none of the validated requests; the non-MoE layer is timed at their
    mean decode position. A trace with no request to spare gives random routing, timed at the
    validated requests' mean decode position."""
    import numpy as np

    from moesim.sim.engine.workload import build_workload
    from moesim.sim.run.profile import trace_requests
    from moesim.sim.run.runner import select_requests
    from moesim.traces.format.trace_file import DECODE

    validated = build_workload(trace, batch_size=1, phases=("prefill", "decode"),
                               requests=select_requests(loaded, trace)[1])
    used = {int(r) for it in validated.iterations for r in it.request_ids.tolist()}
    L = trace.model.num_layers
    rows0 = np.arange(0, trace.num_rows, L)
    req = np.asarray(trace.request_id[rows0])
    spare = [r for r in trace_requests(trace) if r not in used][-n_requests:]
    decode = np.asarray(trace.phase[rows0]) == DECODE
    pick = np.isin(req, spare if spare else sorted(used)) & decode
    pos = np.asarray(trace.token_idx[rows0])[pick]
    context = max(1, int(round(float(pos.mean())))) if len(pos) else 32
    return context, ((trace, spare) if spare else None)


def compare(sim: dict[str, Any], real: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric: predicted, measured, error %."""
    rows = []
    for label, path in METRICS:
        p, m = _get(sim, path), _get(real, path)
        rows.append({"metric": label, "key": path, "predicted": p, "measured": m, "error_pct": error_pct(p, m)})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Rows as strings for a table."""
    out = []
    for r in rows:
        p, m, e = r["predicted"], r["measured"], r["error_pct"]
        digits = 4 if r["key"] in ("hit_rate", "h2d_gb") else 3
        note = ""
        if r["key"] == "hit_rate" and p is not None and m is not None:
            note = "identical" if abs(p - m) < 1e-12 else f"differs by {abs(p - m):.4f}"
        out.append([r["metric"], "-" if p is None else f"{p:.{digits}f}", "-" if m is None else f"{m:.{digits}f}",
                    "-" if e is None else f"{e:+.1f}%", note])
    return out
