"""What ``simctl fit`` writes and prints: ``fitted.yaml``, ``rows.csv``, ``fit.png`` and the
report on the terminal.

``fitted.yaml`` is a file a scenario can take as it stands (:mod:`moesim.sim.config.fitted`):
``calibration:`` for every fitted value, or ``hardware:`` / ``runtime:`` for its sections, which
are written when every row of the fit ran on the same hardware (runtime) once the fitted values
are in: that hardware's full spec with the fitted fields, each field's source naming the fit.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from moesim.sim.config.fitted import ErrorSummary, FitProvenance, FittedFile, lookup, summary_line
from moesim.sim.study.fit import FitResult
from moesim.sim.study.fit_bounds import missing_cost


def shown_path(path: Path) -> str:
    """A measurement file as a fit records it: relative to the working directory when it lies
    below it (a committed fit then names no machine's folders), else absolute."""
    full = path.resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


def provenance(result: FitResult, command: list[str] | None = None) -> FitProvenance:
    """The ``fit:`` section of ``result``."""
    from moesim.sim.study.study_record import moesim_version

    ms = result.ms
    return FitProvenance(
        name=ms.spec.name, source=ms.spec.source, measurements=shown_path(ms.path),
        measurements_sha256=hashlib.sha256(ms.path.read_bytes()).hexdigest() if ms.path.is_file() else "",
        fit_rows=result.fit_error.rows, test_rows=0 if result.held_out is None else result.held_out.rows,
        fit_error=result.fit_error, leave_one_out=result.loo_error, leave_one_out_method=result.loo_method,
        held_out=result.held_out, optimizer={**result.optimizer, "simulator_runs": result.runs,
                                             "engine_paths": result.engine_paths, "wall_s": round(result.wall_s, 2)},
        at_bound=[f"{v.free.label} at {v.at_bound}" for v in result.values if v.at_bound],
        command=shlex.join(command if command is not None else ["simctl", *sys.argv[1:]]),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), moesim=moesim_version())


def _row_records(result: FitResult) -> list[dict[str, Any]]:
    out = []
    for m, p, lp in zip(result.measures, result.predicted, result.loo_predicted, strict=True):
        rec: dict[str, Any] = {"row": m.row.index, "name": m.row.label, "role": m.row.role, "metric": m.metric,
                               "measured": m.measured, "predicted": round(p, 6), "ratio": round(p / m.measured, 6),
                               "loo_predicted": None if lp is None else round(lp, 6),
                               "loo_ratio": None if lp is None else round(lp / m.measured, 6),
                               "groups": dict(m.row.groups), "set": dict(m.row.set),
                               "relative_to": m.row.relative_to or None, "source": m.row.source,
                               "read_off": m.row.read_off}
        out.append(rec)
    return out


def _sections(result: FitResult, fit: FitProvenance) -> dict[str, dict[str, Any]]:
    """The ``hardware:`` / ``runtime:`` sections: written where the fit has a value of that
    section and every row resolves to one and the same spec at the fitted values."""
    from moesim.sim.config.scenario import load_scenario_data, set_key

    ms = result.ms
    fitted = {v.free.key: v for v in result.values}
    specs: dict[str, list[dict[str, Any]]] = {"hardware": [], "runtime": []}
    for row in ms.rows:
        data = json.loads(json.dumps(row.data))
        keys = []
        for v in result.values:
            if v.free.applies_to(row):
                set_key(data, v.free.key.split("."), v.value, v.free.label)
                keys.append(v.free.key)
        loaded = load_scenario_data(data, source=f"{ms.source} {row.where}", base_dir=ms.base_dir,
                                    fixed=(*row.set, *keys))
        specs["hardware"].append(loaded.hardware_spec().model_dump(mode="json", exclude_none=True))
        specs["runtime"].append(loaded.runtime_spec().model_dump(mode="json", exclude_none=True))
    line = summary_line(fit)
    out: dict[str, dict[str, Any]] = {}
    for section, dumps in specs.items():
        mine = [k for k in fitted if k.startswith(f"{section}.")]
        if not mine or any(d != dumps[0] for d in dumps):
            continue
        spec = dict(dumps[0])
        if section == "hardware":
            spec["sources"] = {**spec.get("sources", {}), **{k.split(".")[1]: line for k in mine}}
        else:
            spec["source"] = f"{line}; fitted {', '.join(mine)}; other fields: {spec.get('source') or 'not stated'}"
        out[section] = spec
    return out


def fitted_document(result: FitResult, command: list[str] | None = None) -> dict[str, Any]:
    """The content of ``fitted.yaml`` (validated as :class:`FittedFile`)."""
    fit = provenance(result, command)
    params = [{"key": v.free.key, "value": v.value, "per": v.free.per, "group": v.free.group,
               "min": v.free.lo, "max": v.free.hi, "start": v.start, "at_bound": v.at_bound,
               "bound_source": v.free.hi_source,
               "missing_cost": None if v.at_bound is None else missing_cost(v.free.key, v.at_bound),
               "rel_std": v.rel_std, "source": summary_line(fit), "fit_rows": v.fit_rows,
               "held_out": None if v.held_out is None else v.held_out.model_dump()} for v in result.values]
    doc: dict[str, Any] = {"fit": fit.model_dump(mode="json"), "parameters": params, "rows": _row_records(result)}
    context = {}
    for top in dict.fromkeys(v.free.key.split(".")[0] for v in result.values):
        seen = [lookup(r.data, top) for r in result.ms.rows]
        if seen[0] is not None and all(x == seen[0] for x in seen):
            context[top] = seen[0]
    doc["context"] = context
    doc.update(_sections(result, fit))
    FittedFile.model_validate(doc)
    return doc


CSV_COLUMNS = ("row", "name", "role", "metric", "measured", "predicted", "ratio", "loo_predicted", "loo_ratio",
               "groups", "set", "relative_to", "source", "read_off")


def rows_csv(result: FitResult) -> str:
    """``rows.csv``: one line per measurement (a text cell a spreadsheet would run as a formula
    guarded: :func:`~moesim.sim.core.escape.csv_cell`)."""
    from moesim.sim.core.escape import csv_cell

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for rec in _row_records(result):
        w.writerow([csv_cell("" if rec[c] is None else json.dumps(rec[c], sort_keys=True) if isinstance(rec[c], dict)
                             else rec[c]) for c in CSV_COLUMNS])
    return buf.getvalue()


def write_fit(result: FitResult, out: Path, *, force: bool = False, command: list[str] | None = None) -> list[Path]:
    """Write ``fitted.yaml``, ``rows.csv`` and ``fit.png`` into ``out``, whole or not at all."""
    from moesim.sim.core.atomic import atomic_folder
    from moesim.sim.study.fit_plot import fit_figure

    doc = fitted_document(result, command)
    head = ("# moesim fit (simctl fit): values fitted to measurements by running the simulator.\n"
            "# In a scenario: `calibration: fitted.yaml` applies every fitted value (a per-group value: the\n"
            "# group matching the scenario); `hardware: fitted.yaml` / `runtime: fitted.yaml` take the\n"
            "# sections below, written when every row ran on one hardware / runtime.\n")
    names = ["fitted.yaml", "rows.csv", "fit.png"]
    with atomic_folder(out, option="--out", force=force, kind="fit") as tmp:
        (tmp / "fitted.yaml").write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))
        (tmp / "rows.csv").write_text(rows_csv(result))
        fit_figure(result, tmp / "fit.png")
    return [out / n for n in names]


def short(summary: ErrorSummary | None) -> str:
    """``4 rows, max 1.09x``: an error summary in a table cell."""
    if summary is None or not summary.rows or summary.max_ratio is None:
        return "-"
    return f"{summary.rows} rows, median {summary.median_abs_error_pct:.1f}%, max {summary.max_ratio:.2f}x"


def report(result: FitResult, console: Any) -> None:
    """The fitted values and the errors, on the terminal."""
    from rich.markup import escape
    from rich.table import Table

    ms = result.ms
    n_fit = result.fit_error.rows
    n_test = 0 if result.held_out is None else result.held_out.rows
    t = Table("value", "group", "fitted", "bounds", "start", "rel. std", "its held-out rows",
              title=f"{ms.spec.name}: {len(result.values)} values fitted to {n_fit} measurements")
    for v in result.values:
        grp = "all rows" if v.free.per is None else f"{v.free.per}={v.free.group}"
        bound = f"[{v.free.lo:g}, {v.free.hi:g}]" + (f" AT {v.at_bound.upper()}" if v.at_bound else "")
        t.add_row(v.free.key, grp, f"{v.value:.5g}", bound, f"{v.start:.4g}",
                  "-" if v.rel_std is None else f"{v.rel_std:.1%}", short(v.held_out))
    if result.values:
        console.print(t)
    console.print(f"fit rows:      {result.fit_error.line()}")
    if result.loo_error is not None:
        skipped = n_fit - result.loo_error.rows
        note = f" ({skipped} without a prediction: their group has no other fit row)" if skipped else ""
        console.print(f"leave-one-out: {result.loo_error.line()}{note} ({result.loo_method})", markup=False)
    console.print(f"held-out:      {result.held_out.line() if n_test and result.held_out else 'no test rows'}")
    opt = result.optimizer
    paths = ", ".join(f"{k or 'unknown'} {n}" for k, n in result.engine_paths.items())
    if not result.values:
        console.print(f"{result.runs} simulator runs, nothing fitted (fit: {{}}); engine: {paths}; "
                      f"{result.wall_s:.1f} s", markup=False)
        return
    console.print(f"{result.runs} simulator runs ({opt['grid_combinations']} grid points; least squares "
                  f"{opt['evaluations']} evaluations + {opt['jacobians']} Jacobians, Nelder-Mead polish "
                  f"{opt['polish_evaluations']} evaluations, improved {opt['polish_improved_groups']} of "
                  f"{opt['independent_groups']} groups; engine: {paths}), {result.wall_s:.1f} s", markup=False)
    for v in result.values:
        if v.free.hi_source:
            console.print(f"{v.free.label}: upper bound {v.free.hi:g} from {v.free.hi_source}", markup=False,
                          highlight=False)
        if v.at_bound:
            console.print(f"[yellow]warning[/yellow]: {escape(v.free.label)} = {v.value:.5g} is AT its {v.at_bound} "
                          f"bound: not a measurement; the fit stops there. Missing cost: "
                          f"{escape(missing_cost(v.free.key, v.at_bound))}", highlight=False)
