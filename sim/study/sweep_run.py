"""Running a sweep: points on a local process pool or a Dask cluster, one result file per point.

The output folder holds ``points/<config hash>.json`` (one per finished point, written to a
temporary file and moved in with ``os.replace``, so it is whole or absent) and, at the end,
``results.parquet``: one row per point in sweep order, the swept keys, ``policy``, ``bound`` and
``kind`` (``lossless``, ``lossy`` or ``oracle``: the group a comparison ranks it in), every metric
(nested ones flattened as ``tpot_ms_mean``; ``warnings`` as a JSON list), ``applied`` (a JSON list
of the setup defaults applied to the point, :mod:`moesim.sim.study.needs`), ``status`` (ok,
error, or n/a when the policy cannot run as its paper meant it on this trace and scenario: such
a point is not run), ``error`` (its one line, or the n/a reason), ``config_hash``,
``moesim_version`` and ``wall_s``.

Running the same sweep again skips every point whose file exists (killed sweeps resume where
they were; failed points too, unless ``retry_failed``); the folder is this study's only when its
marker says so (:mod:`moesim.sim.study.study_folder`, which also locks it while the study runs). A point that raises is recorded with its
one-line error and the others go on. Workers load each trace once and keep it, keyed by its
path and content hash (or by its synthetic parameters).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.atomic import OutputError, atomic_file, terminate_cleanly
from moesim.sim.core.install_hint import extra_hint
from moesim.sim.study.progress import MODES
from moesim.sim.study.progress import progress as show_progress
from moesim.sim.study.study_folder import check_study_out, study_folder
from moesim.sim.study.study_record import moesim_version, record_study
from moesim.sim.study.sweep import Point, Sweep, SweepError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from moesim.sim.config.scenario import LoadedScenario
    from moesim.traces.format.trace_file import Trace

TABLE = "results.parquet"
NOT_APPLICABLE = "n/a"  # status of a point whose policy needs a trace column the trace lacks
POINTS = "points"
_TRACES: dict[tuple[str, str], Trace] = {}


# --- in the worker --------------------------------------------------------------------------------
def cached_trace(loaded: LoadedScenario) -> Trace:
    """The scenario's trace, loaded once per process: keyed by path and content hash, or by
    the synthetic generator's parameters."""
    from moesim.traces.format.trace_file import read_trace, trace_from_columns

    spec = loaded.scenario.trace
    if isinstance(spec, str):
        path = Path(spec).expanduser()
        path = (path if path.is_absolute() else loaded.base_dir / path).resolve()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        key = (str(path), digest)
        if key not in _TRACES:
            _TRACES[key] = read_trace(path)
    else:
        key = ("synthetic", json.dumps(spec, sort_keys=True))
        if key not in _TRACES:
            from moesim.traces.synthetic.generator import SynthParams, generate

            cols, meta = generate(SynthParams.model_validate(spec["synthetic"]))
            _TRACES[key] = trace_from_columns(cols, meta)
    return _TRACES[key]


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as flat columns: ``{"tpot_ms": {"mean": 1}}`` -> ``{"tpot_ms_mean": 1}``."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{name}_"))
        elif isinstance(v, (list, tuple)):
            out[name] = json.dumps(v)
        else:
            out[name] = v
    return out


def one_line(exc: BaseException) -> str:
    """An exception as one line: moesim's own errors as they read, others with their type."""
    from moesim.sim.core.errors import MoesimError

    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, MoesimError) else f"{type(exc).__name__}: {text}"


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point (``task`` from :func:`point_task`) and return its result record; never raises.
    The record's ``wall_s`` and ``cpu_s`` are the point's wall and CPU seconds in its worker (on a
    shared machine the CPU time is what other users cannot take away)."""
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    record: dict[str, Any] = {"config_hash": task["config_hash"], "index": task["index"], "params": task["params"],
                              "moesim_version": moesim_version(), "host": os.uname().nodename, "pid": os.getpid()}
    from moesim.policies.contract.plugins import allow_plugins
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.runner import PolicyNotApplicable, run_loaded

    if task.get("allow_plugins"):   # the user's word, given to the command that started this worker
        allow_plugins()
    try:
        loaded = load_scenario_data(task["data"], source=task["source"], base_dir=Path(task["base_dir"]))
        result = run_loaded(loaded, trace=cached_trace(loaded))
        metrics = dict(result.metrics)
        metrics.pop("config_hash", None)
        record.update(status="ok", error=None, metrics=flatten(metrics))
    except PolicyNotApplicable as exc:  # the policy does not apply to this trace: not a failure
        record.update(status=NOT_APPLICABLE, error=one_line(exc), metrics={})
    except Exception as exc:  # a failing point is recorded; the sweep goes on
        record.update(status="error", error=one_line(exc), metrics={})
    record["wall_s"] = time.perf_counter() - t0
    record["cpu_s"] = time.process_time() - cpu0
    return record


def not_applicable(point: Point) -> dict[str, Any]:
    """The record of a point whose policy's needs this trace or scenario cannot meet: ``n/a``
    with the reason, without running it."""
    return {"config_hash": point.config_hash, "index": point.index, "params": point.params,
            "moesim_version": moesim_version(), "status": NOT_APPLICABLE, "error": point.unmet,
            "metrics": {}, "wall_s": 0.0, "cpu_s": 0.0}


def point_task(point: Point) -> dict[str, Any]:
    """What a worker needs to run ``point``: plain, picklable data (with whether the user allowed
    plugin code, for workers started before or elsewhere: :mod:`moesim.policies.contract.plugins`)."""
    from moesim.policies.contract.plugins import plugins_allowed

    return {"index": point.index, "config_hash": point.config_hash, "params": point.params, "data": point.data,
            "source": point.source, "base_dir": str(point.base_dir), "allow_plugins": plugins_allowed()}


# --- the result store -----------------------------------------------------------------------------
class PointStore:
    """``<out>/points/<config hash>.json``, each written atomically. ``create`` (the study's own
    locked folder: :func:`run_sweep`) makes ``points/`` and removes temporary files a killed
    writer left; without it the store only reads."""

    def __init__(self, out: Path, *, create: bool = False) -> None:
        self.dir = out / POINTS
        if create:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
            for stale in self.dir.glob(".*.tmp"):  # left by a killed writer; never a finished point
                stale.unlink(missing_ok=True)

    def load(self) -> dict[str, dict[str, Any]]:
        """Every finished point's record, by config hash."""
        out: dict[str, dict[str, Any]] = {}
        for f in self.dir.glob("*.json"):
            try:
                rec = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            out[f.stem] = rec
        return out

    def write(self, record: dict[str, Any]) -> None:
        """Write one record: a temporary file, flushed to disk, then renamed over the final name."""
        final = self.dir / f"{record['config_hash']}.json"
        tmp = self.dir / f".{record['config_hash']}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(record, fh, default=_json_default)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except OSError as exc:   # a full disk, a folder gone: one line; the finished points stay
            tmp.unlink(missing_ok=True)
            raise OutputError(f"--out {final.parent.parent}: cannot write point {record['config_hash']} "
                              f"({exc.strerror or exc}); run the same command again to resume") from None


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return str(v)


# --- executors ------------------------------------------------------------------------------------
@contextmanager
def _local_pool(jobs: int) -> Iterator[Callable[[list[dict[str, Any]]], Iterator[dict[str, Any]]]]:
    if jobs <= 1:
        yield lambda tasks: (run_point(t) for t in tasks)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from moesim.sim.study.worker_life import start_worker, stop_pool, this_process

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["moesim.sim.study.sweep_run", "moesim.sim.run.runner"])
    # workers die with this process, even on kill -9 (worker_life); an interrupt ends them at once
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=start_worker,
                             initargs=(this_process(),)) as pool:

        def run(tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            futures = {pool.submit(run_point, t): t for t in tasks}
            try:
                for fut in as_completed(futures):
                    try:
                        yield fut.result()
                    except Exception as exc:  # the worker process died
                        yield _lost(futures[fut], exc)
            finally:
                for fut in futures:
                    fut.cancel()

        try:
            yield run
        except BaseException:   # Ctrl-C, SIGTERM or an error of the driver: no point is waited for
            stop_pool(pool)
            raise


@contextmanager
def _dask(address: str) -> Iterator[Callable[[list[dict[str, Any]]], Iterator[dict[str, Any]]]]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise SweepError("--dask needs dask.distributed: " + extra_hint("sweep")) from None
    cluster = None
    if address.startswith("local:"):
        try:
            n = int(address.removeprefix("local:"))
            if n < 1:
                raise ValueError
        except ValueError:
            raise SweepError(f"--dask {address}: expected local:N with N >= 1 workers") from None
        import logging

        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    elif "://" in address:
        try:
            client = Client(address, timeout=30)
        except (OSError, TimeoutError) as exc:
            raise SweepError(f"--dask {address}: cannot reach the scheduler ({one_line(exc)})") from None
    else:
        raise SweepError(f"--dask {address}: expected local:N or a scheduler address such as tcp://HOST:8786")

    def run(tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        run_id = uuid.uuid4().hex[:8]
        futures = {client.submit(run_point, t, key=f"moesim-point-{t['config_hash']}-{run_id}", pure=False): t
                   for t in tasks}
        try:
            for fut in as_completed(list(futures)):
                try:
                    yield fut.result()
                except Exception as exc:  # the worker died (KilledWorker) or the task could not run
                    yield _lost(futures[fut], exc)
        finally:
            client.cancel(list(futures))

    try:
        yield run
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _lost(task: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    return {"config_hash": task["config_hash"], "index": task["index"], "params": task["params"],
            "moesim_version": moesim_version(), "status": "error", "metrics": {}, "wall_s": None,
            "error": f"worker lost: {one_line(exc)}"}


# --- the driver -----------------------------------------------------------------------------------
@dataclass
class SweepOutcome:
    """What a sweep did: the table's path, and counts of points run, skipped and failed."""

    table: Path
    total: int
    ran: int
    skipped: int
    failed: list[tuple[int, str]] = field(default_factory=list)
    not_applicable: list[tuple[int, str]] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> str:
        """``40 points: 31 ok, 1 failed, 8 n/a`` (n/a points are not failures: their policy
        cannot run as its paper meant it here, and they were not run)."""
        return f"{self.total} points: {self.counts()}"

    def counts(self) -> str:
        """``31 ok, 1 failed, 8 n/a``."""
        ok = self.total - len(self.failed) - len(self.not_applicable)
        return f"{ok} ok, {len(self.failed)} failed, {len(self.not_applicable)} n/a"


def default_jobs() -> int:
    """Worker processes for a local pool: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_dask_address(address: str) -> None:
    """``local:N`` (N >= 1) or ``SCHEME://HOST:PORT``; anything else is a one-line error, given
    before any output is written."""
    if address.startswith("local:"):
        n = address.removeprefix("local:")
        if not (n.isdigit() and int(n) >= 1):
            raise SweepError(f"--dask {address}: expected local:N with N >= 1 workers")
    elif "://" not in address:
        raise SweepError(f"--dask {address}: expected local:N or a scheduler address such as tcp://HOST:8786")


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int | None = None, dask: str | None = None,
              retry_failed: bool = False, progress: bool | str = False, force: bool = False,
              command: list[str] | None = None) -> SweepOutcome:
    """Run every point of ``sweep`` not already finished in ``out``, then write the table.
    ``out`` is new, empty, or this study's folder (resumed); ``force`` replaces another moesim
    output there with a fresh study (:func:`moesim.sim.study.study_folder.study_folder`, which
    also locks the folder while the study runs). ``progress`` is a mode of
    :data:`moesim.sim.study.progress.MODES` (True: the bar, False: nothing); ``command`` (the
    command line, default ``sys.argv``) is recorded in ``study.json`` (:func:`record_study`)."""
    t0 = time.perf_counter()
    out_dir = Path(out)
    check_study_out(out_dir, sweep, force=force)
    if dask:
        check_dask_address(dask)
    with study_folder(out_dir, sweep, force=force):
        return _run_points(sweep, out_dir, jobs=jobs, dask=dask, retry_failed=retry_failed, progress=progress,
                           command=command, t0=t0)


def _run_points(sweep: Sweep, out_dir: Path, *, jobs: int | None, dask: str | None, retry_failed: bool,
                progress: bool | str, command: list[str] | None, t0: float) -> SweepOutcome:
    store = PointStore(out_dir, create=True)
    done = store.load()
    todo = [p for p in sweep.points
            if p.config_hash not in done or (retry_failed and done[p.config_hash].get("status") != "ok")]
    skipped = len(sweep.points) - len(todo)
    n_a = [p for p in todo if p.unmet is not None]
    for p in n_a:   # recorded, never run
        rec = not_applicable(p)
        store.write(rec)
        done[p.config_hash] = rec
    # longest first would need a cost model; policies with heavier bookkeeping are spread by order
    tasks = [point_task(p) for p in todo if p.unmet is None]
    executor = _dask(dask) if dask else _local_pool(min(jobs or default_jobs(), max(1, len(tasks))))
    record_study(out_dir, sweep, command)
    mode = progress if isinstance(progress, str) else ("bar" if progress else "off")
    if mode not in MODES:
        raise SweepError(f"progress: {mode!r}: choose from {', '.join(MODES)}")
    queued = {t["config_hash"] for t in tasks}
    pre_na = sum(1 for p in sweep.points if p.config_hash not in queued
                 and done.get(p.config_hash, {}).get("status") == NOT_APPLICABLE)
    # SIGTERM unwinds as Ctrl-C does: the workers are ended, the finished points stay (a rerun resumes)
    with terminate_cleanly(), show_progress(mode, sweep.spec.name, len(sweep.points), skipped + len(n_a),
                                            pre_na) as tick:
        if tasks:
            with executor as run:
                for rec in run(tasks):
                    store.write(rec)
                    done[rec["config_hash"]] = rec
                    tick(rec)
    table = write_table(sweep, done, out_dir / TABLE)
    failed = [(p.index, str(done[p.config_hash].get("error"))) for p in sweep.points
              if done[p.config_hash].get("status") not in ("ok", NOT_APPLICABLE)]
    not_run = [(p.index, f"{p.policy}: {done[p.config_hash].get('error')}") for p in sweep.points
               if done[p.config_hash].get("status") == NOT_APPLICABLE]
    return SweepOutcome(table=table, total=len(sweep.points), ran=len(tasks), skipped=skipped, failed=failed,
                        not_applicable=not_run, wall_s=time.perf_counter() - t0)


# --- the table ------------------------------------------------------------------------------------
def param_column(key: str, values: list[Any]) -> tuple[str, list[Any]]:
    """A swept key's column: its name and Parquet-friendly values (mappings and lists as JSON,
    mixed types as text). A ``policy`` swept as mappings is named ``policy_spec``, as ``policy``
    holds the resolved name."""
    encoded = [json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for v in values]
    kinds = {type(v) for v in encoded if v is not None}
    if len(kinds) > 1 and not kinds <= {int, float}:
        encoded = [None if v is None else str(v) for v in encoded]
    name = "policy_spec" if key == "policy" and any(not isinstance(v, str) for v in values) else key
    return name, encoded


def table_frame(sweep: Sweep, records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per point, in sweep order (points without a record are left out)."""
    import pandas as pd

    points = [p for p in sweep.points if p.config_hash in records]
    cols: dict[str, list[Any]] = {"point": [p.index for p in points]}
    for key in sweep.param_keys:
        name, values = param_column(key, [p.params[key] for p in points])
        if name != "policy":
            cols[name] = values
    cols["policy"] = [p.policy for p in points]
    cols["bound"] = [p.bound for p in points]
    cols["kind"] = [p.kind for p in points]
    cols["applied"] = [json.dumps(p.applied) for p in points]
    metric_names: list[str] = []
    for p in points:
        for k in records[p.config_hash].get("metrics", {}):
            if k not in metric_names and k not in ("policy", "bound", "kind", "applied"):
                metric_names.append(k)
    for k in metric_names:
        cols[k] = [records[p.config_hash].get("metrics", {}).get(k) for p in points]
    for k in ("status", "error", "wall_s", "moesim_version"):
        cols[k] = [records[p.config_hash].get(k) for p in points]
    cols["config_hash"] = [p.config_hash for p in points]
    df = pd.DataFrame(cols)
    for k in metric_names:  # text-valued metrics (a lossy policy's note) stay text; numbers become floats
        if df[k].map(lambda v: isinstance(v, str)).any():
            df[k] = df[k].astype("string")
    return df


def write_table(sweep: Sweep, records: dict[str, dict[str, Any]], path: Path) -> Path:
    """Write :func:`table_frame` as Parquet, atomically; the swept columns are named in the
    schema metadata (``moesim.params``) for ``simctl plot``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = table_frame(sweep, records)
    params = [param_column(k, [p.params[k] for p in sweep.points])[0] for k in sweep.param_keys]
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"moesim.params"] = json.dumps(params).encode()
    meta[b"moesim.sweep"] = json.dumps({"name": sweep.spec.name, "source": sweep.source}).encode()
    with atomic_file(path, option="--out", force=True) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
    return path
