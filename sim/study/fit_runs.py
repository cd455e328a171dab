"""Running the rows of a measurement file through the simulator, for ``simctl fit``.

A row's prediction at a point of the fit is one simulator run of its scenario with the fitted
values that apply to it (a ratio row, ``relative_to``: two runs, the row's and its reference's;
a mean row, ``mean_over``: those runs once per setup, the metric averaged over the setups before
a ratio is taken). :class:`RowRunner` keeps every run's result keyed by the row and those
values, so a finite-difference column of a value fitted per hardware reruns only that hardware's
rows, and the leave-one-out refits reuse the full fit's runs. Runs that are not yet known are
run in one batch: inline, or over ``jobs`` worker processes (each loads a trace once).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.sim.core.errors import MoesimError
from moesim.sim.study.fit_spec import FitError, Measurements

Values = tuple[tuple[str, float], ...]
"""The fitted values of one run: ``((dotted key, value), ...)`` in the fit's order."""


@dataclass(frozen=True)
class RowJob:
    """What a worker needs to run one row: plain, picklable data."""

    index: int
    data: dict[str, Any]
    source: str
    base_dir: str
    fixed: tuple[str, ...]
    metrics: tuple[str, ...]
    reference: dict[str, Any] | None = None
    """A ratio row's reference scenario: its metrics divide the row's."""
    reference_fixed: tuple[str, ...] = ()
    more: tuple[tuple[dict[str, Any], tuple[str, ...], dict[str, Any] | None, tuple[str, ...]], ...] = ()
    """A mean row's other setups (``mean_over`` after the first, which is ``data``), each as
    (scenario, its fixed keys, reference or None, the reference's fixed keys)."""


@dataclass(frozen=True)
class Outcome:
    """One run of a row: the measured metrics' predicted values, or why there are none."""

    values: dict[str, float | None]
    engine_path: str = ""
    error: str | None = None
    missing: str | None = None
    scalars: tuple[str, ...] = ()
    undefined: str | None = None
    """Why a ratio has no value (its reference's metric is zero or null): the value is then
    infinite, a miss on a held-out row and an error on a fit row."""


def scalar_metrics(metrics: dict[str, Any], prefix: str = "") -> list[str]:
    """The names a row may measure: numeric metrics, ``ttft_ms`` style means, and dotted
    members of nested ones (``tpot_ms.p50``)."""
    out: list[str] = []
    for k, v in metrics.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            if "mean" in v:
                out.append(name)
            out += scalar_metrics(v, f"{name}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(name)
    return out


def metric_value(metrics: dict[str, Any], name: str) -> float | None:
    """A measured metric's value in a run's metrics: ``tpot_ms`` is its mean; KeyError when
    the metrics have no such scalar."""
    node: Any = metrics
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(name)
        node = node[part]
    if isinstance(node, dict):
        if "mean" not in node:
            raise KeyError(name)
        node = node["mean"]
    if node is None:
        return None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise KeyError(name)
    return float(node)


TRACES_KEPT = 16
"""Traces a process keeps loaded (the oldest loaded goes first)."""
_TRACES: dict[str, Any] = {}
_JOBS: list[RowJob] = []
_MS: Measurements | None = None


def _trace(loaded: Any) -> Any:
    """The scenario's trace, loaded once per process (keyed by the synthetic parameters, or the
    file's path, size and modification time)."""
    from moesim.sim.run.runner import load_trace

    path = loaded.trace_path()
    if path is None:
        key = json.dumps(loaded.scenario.trace, sort_keys=True)
    else:
        st = path.stat() if path.exists() else None
        key = f"{path.resolve()}:{st.st_size if st else 0}:{st.st_mtime_ns if st else 0}"
    if key not in _TRACES:
        if len(_TRACES) >= TRACES_KEPT:   # a fitted trace.synthetic.* key makes a new trace at each point
            del _TRACES[next(iter(_TRACES))]
        _TRACES[key] = load_trace(loaded)
    return _TRACES[key]


def _metrics(data: dict[str, Any], source: str, base_dir: str, fixed: tuple[str, ...], values: Values) -> dict[str, Any]:
    from moesim.sim.config.scenario import load_scenario_data, set_key
    from moesim.sim.run.runner import run_loaded

    data = copy.deepcopy(data)
    for key, value in values:
        set_key(data, key.split("."), value, f"{source}: {key}")
    loaded = load_scenario_data(data, source=source, base_dir=Path(base_dir), fixed=(*fixed, *(k for k, _ in values)))
    metrics: dict[str, Any] = run_loaded(loaded, steps=False, trace=_trace(loaded)).metrics
    return metrics


def run_job(job: RowJob, values: Values) -> Outcome:
    """Run one row at ``values``: its measured metrics (of a ratio row: divided by its
    reference's), or the one-line reason it did not run."""
    setups = ((job.data, job.fixed, job.reference, job.reference_fixed), *job.more)
    runs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    try:
        for j, (data, fixed, reference, reference_fixed) in enumerate(setups):
            where = job.source if not job.more else f"{job.source} mean_over[{j}]"
            metrics = _metrics(data, where, job.base_dir, fixed, values)
            ref = None if reference is None else _metrics(reference, f"{where} (relative_to)", job.base_dir,
                                                          reference_fixed, values)
            runs.append((metrics, ref))
    except MoesimError as exc:
        return Outcome({}, error=" ".join(str(exc).split()))
    out: dict[str, float | None] = {}
    undefined = None
    for name in job.metrics:
        try:
            own = [metric_value(m, name) for m, _ in runs]
            value = None if None in own else math.fsum(v for v in own if v is not None) / len(own)
            if job.reference is not None and value is not None:
                refs = [metric_value(r, name) for _, r in runs if r is not None]
                denominator = None if None in refs else math.fsum(v for v in refs if v is not None) / len(refs)
                if not denominator:
                    undefined = f"{job.source}: {name} of the relative_to reference is {denominator}: no ratio"
                    value = math.inf
                else:
                    value /= denominator
            out[name] = value
        except KeyError:
            return Outcome({}, missing=name, scalars=tuple(scalar_metrics(runs[0][0])))
    return Outcome(out, engine_path=str(runs[0][0].get("engine_path", "")), undefined=undefined)


def row_jobs(ms: Measurements) -> list[RowJob]:
    """What running each row of ``ms`` takes, by row index."""
    jobs = []
    for r in ms.rows:
        fixed = [(*r.set, *keys) for keys in r.mean_over] or [tuple(r.set)]
        setups = r.variants or [(r.data, r.reference)]
        more = tuple((d, f, ref, (*f, *r.relative_to)) for (d, ref), f in zip(setups[1:], fixed[1:], strict=True))
        jobs.append(RowJob(index=r.index, data=r.data, source=f"{ms.source}: {r.where}", base_dir=str(ms.base_dir),
                           fixed=fixed[0], metrics=tuple(r.measured), reference=r.reference,
                           reference_fixed=(*fixed[0], *r.relative_to), more=more))
    return jobs


def _init_worker(ms: Measurements, allow: bool) -> None:
    global _JOBS, _MS
    if allow:   # the user's word, given to the command that started this worker
        from moesim.policies.contract.plugins import allow_plugins

        allow_plugins()
    _MS = ms
    _JOBS = row_jobs(ms)


def worker_measurements() -> Measurements:
    """In a worker process: the measurement file the pool was started for."""
    assert _MS is not None, "not in a fit worker"
    return _MS


def _run_task(task: tuple[int, Values]) -> Outcome:
    return run_job(_JOBS[task[0]], task[1])


class RowRunner:
    """Predictions of rows at fitted values, each run once (see the module). ``runs`` counts
    the simulator runs, those of refinements done in workers included."""

    def __init__(self, ms: Measurements, jobs: int = 1) -> None:
        self.ms = ms
        self.jobs_n = max(1, jobs)
        self.jobs = row_jobs(ms)
        self.cache: dict[tuple[int, Values], Outcome] = {}
        self.runs = 0
        self._pool: Any = None
        self.progress: Any = None
        """A :class:`~moesim.sim.study.fit_progress.FitProgress` told of every run, or None."""

    def pending(self, tasks: list[tuple[int, Values]]) -> int:
        """How many distinct runs of ``tasks`` are not yet known."""
        return len({t for t in tasks if t not in self.cache})

    def executor(self) -> Any:
        """The worker processes (started on first use), each holding the measurement file."""
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            from moesim.policies.contract.plugins import plugins_allowed
            from moesim.sim.study.worker_life import start_worker, this_process

            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["moesim.sim.study.fit", "moesim.sim.run.runner"])
            self._pool = ProcessPoolExecutor(max_workers=self.jobs_n, mp_context=ctx,
                                             initializer=start_worker,   # workers die with this process (worker_life)
                                             initargs=(this_process(), _init_worker, self.ms, plugins_allowed()))
        return self._pool

    def run(self, tasks: list[tuple[int, Values]]) -> None:
        """Run every (row, values) not yet known, in one batch; a row that does not run, or whose
        measured metric is not in its metrics, is a :class:`FitError`."""
        todo = list(dict.fromkeys(t for t in tasks if t not in self.cache))
        if not todo:
            return
        if self.jobs_n == 1 or len(todo) < 4:
            results: Any = (run_job(self.jobs[i], v) for i, v in todo)
        else:
            chunk = max(1, math.ceil(len(todo) / (self.jobs_n * 4)))
            results = self.executor().map(_run_task, todo, chunksize=chunk)
        outcomes = []
        for outcome in results:   # in the order of todo, whichever process ran it
            outcomes.append(outcome)
            if self.progress is not None:
                self.progress.runs(1)
        self.runs += len(todo)
        for task, outcome in zip(todo, outcomes, strict=True):
            self._check(task, outcome)
            self.cache[task] = outcome

    def _check(self, task: tuple[int, Values], outcome: Outcome) -> None:
        row = self.ms.rows[task[0]]
        at = ", ".join(f"{k}={v:.6g}" for k, v in task[1])
        if outcome.error is not None:
            msg = outcome.error
            prefix = f"{self.ms.source}: {row.where}"
            msg = msg if msg.startswith(prefix) else f"{prefix}: {msg}"
            raise FitError(f"{msg} (the row does not run at {at})" if at else f"{msg} (the row does not run)")
        if outcome.undefined is not None and row.role == "fit":
            raise FitError(f"{outcome.undefined} (a fit row needs a value; at {at or 'the base'})")
        if outcome.missing is not None:
            known = ", ".join(s for s in outcome.scalars if "." not in s)
            raise FitError(f"{self.ms.source}: {row.where}: {outcome.missing}: not a scalar metric of "
                           f"metrics.json (known: {known})")
        for name, value in outcome.values.items():
            if value is None:
                raise FitError(f"{self.ms.source}: {row.where}: {name}: null in this row's metrics.json "
                               "(the run has nothing to measure it by); measure another metric")

    def outcome(self, index: int, values: Values) -> Outcome:
        """A known run (after :meth:`run`)."""
        return self.cache[(index, values)]

    def close(self) -> None:
        """Stop the worker processes, if any started."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
