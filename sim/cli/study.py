"""The study commands of ``simctl``: ``sweep``, ``compare`` and ``plot``.

They are registered in :mod:`moesim.sim.cli.main`; everything heavy (pandas, matplotlib, dask) is
imported inside the functions so that ``simctl --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from moesim.sim.cli.interrupted import resumable
from moesim.sim.cli.plugin_option import ALLOW_PLUGINS, grant_plugins
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.escape import csv_safe, terminal, visible

_JOBS = typer.Option("--jobs", "-j", help="local worker processes (default: the CPUs available)")
_DASK = typer.Option("--dask", help="run on Dask: local:N starts a LocalCluster of N workers; tcp://HOST:PORT joins a scheduler")
_SET = typer.Option("--set", help="override a key of the base scenario: --set workload.requests=4 (repeatable)")


def _show_progress(flag: bool | None) -> str:
    """The progress mode: the bar on a terminal, a line per few points elsewhere (--progress
    forces the bar, --no-progress silences both)."""
    if flag is None:
        return "bar" if Console(stderr=True).is_terminal else "lines"
    return "bar" if flag else "off"


def _command(ctx: typer.Context) -> list[str] | None:
    """The command line as typed (``simctl`` passes it to click as ``obj``), for study.json."""
    obj = ctx.find_root().obj
    argv = obj.get("argv") if isinstance(obj, dict) else None
    return [str(a) for a in argv] if isinstance(argv, list) else None


def _out_dir(out: Path | None, sweep: object) -> Path:
    """``--out``, or the default folder that never overwrites another study's results."""
    from moesim.sim.study.study_record import default_out
    from moesim.sim.study.sweep import Sweep

    assert isinstance(sweep, Sweep)
    if out is not None:
        return out
    folder, note = default_out(sweep)
    if note:
        Console(stderr=True).print(note, highlight=False, markup=False, soft_wrap=True)
    return folder


def _kept(sweep: object, out: Path) -> Callable[[], tuple[int, int]]:
    """How many of the study's points have a result file in ``out`` (for an interrupted study)."""
    from moesim.sim.study.sweep import Sweep
    from moesim.sim.study.sweep_run import POINTS

    assert isinstance(sweep, Sweep)

    def count() -> tuple[int, int]:
        have = {p.stem for p in (out / POINTS).glob("*.json")} if (out / POINTS).is_dir() else set()
        return sum(p.config_hash in have for p in sweep.points), len(sweep.points)

    return count


def _report(outcome: object, out: Path) -> None:
    from moesim.sim.study.sweep_run import SweepOutcome

    assert isinstance(outcome, SweepOutcome)
    err = Console(stderr=True)
    why = " (not run: the policy cannot run as its paper meant it here)" if outcome.not_applicable else ""
    err.print(f"{outcome.total} points: {outcome.ran} run, {outcome.skipped} already done; {outcome.counts()}{why}; "
              f"{outcome.wall_s:.1f} s", highlight=False)
    reasons = list(dict.fromkeys(msg for _, msg in outcome.not_applicable))
    for msg in reasons[:10]:
        err.print(f"  n/a {visible(msg)}", highlight=False, markup=False, soft_wrap=True)
    if len(reasons) > 10:
        err.print(f"  ... and {len(reasons) - 10} more (see the error column)")
    for index, msg in outcome.failed[:10]:
        err.print(f"  [red]point {index} failed[/red]: {terminal(msg)}", markup=True, highlight=False)
    if len(outcome.failed) > 10:
        err.print(f"  ... and {len(outcome.failed) - 10} more (see the error column)")
    err.print(f"table: {visible(outcome.table)}", markup=False, highlight=False)


def sweep_cmd(
    ctx: typer.Context,
    sweep_file: Annotated[Path, typer.Argument(help="sweep YAML file (base scenario + grid and/or zip)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output folder (default: runs/<sweep name>, "
                                             "or a timestamped one beside it if that holds another study)")] = None,
    jobs: Annotated[int | None, _JOBS] = None,
    dask: Annotated[str | None, _DASK] = None,
    set_: Annotated[list[str] | None, _SET] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="run failed points again")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list the points and whether each is done; run nothing")] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bar (default: a bar on a terminal, "
                                                   "else a line per few points with the time left)")] = None,
    force: Annotated[bool, typer.Option("--force", help="clear a non-empty --out folder and start afresh "
                                        "(without it, only a sweep folder is reused: resumed)")] = False,
    allow_plugins: Annotated[bool, ALLOW_PLUGINS] = False,
    seeds: Annotated[int, typer.Option("--seeds", help="replicate every point with seeds 0..N-1 (plot, compare "
                                       "tables and report give means with 95% intervals and mark tied ranks)")] = 1,
) -> None:
    """Run a sweep: every point of the grid, resumable, into one tidy Parquet table."""
    from moesim.sim.study.sweep import load_sweep
    from moesim.sim.study.sweep_run import PointStore, run_sweep

    grant_plugins(allow_plugins)
    sweep = load_sweep(sweep_file, set_ or [], seeds=seeds)
    out_dir = _out_dir(out, sweep) if not dry_run else (out or Path("runs") / sweep.spec.name)
    if jobs is not None and jobs < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--jobs")
    if dry_run:
        done = PointStore(out_dir).load() if out_dir.is_dir() else {}
        for p in sweep.points:
            state = done.get(p.config_hash, {}).get("status", "n/a" if p.unmet else "todo")
            vals = "  ".join(f"{k}={json.dumps(v)}" for k, v in p.params.items())
            print(f"{p.index:5d}  {p.config_hash}  {state:5s}  {vals}")
        for note in dict.fromkeys(n for p in sweep.points for n in p.applied):
            print(f"applied: {note}")
        for name, reason in dict.fromkeys((p.policy, p.unmet) for p in sweep.points if p.unmet):
            print(f"n/a {name}: {reason}")
        print(f"{len(sweep.points)} points, {sum(p.config_hash in done for p in sweep.points)} done, output {out_dir}")
        return
    with resumable(_command(ctx), out_dir, _kept(sweep, out_dir)):
        outcome = run_sweep(sweep, out_dir, jobs=jobs, dask=dask, retry_failed=retry_failed,
                            progress=_show_progress(progress), force=force, command=_command(ctx))
    _report(outcome, out_dir)


def _floats(text: str | None, option: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected numbers separated by commas, got {text!r}", param_hint=option) from None


def compare_cmd(
    ctx: typer.Context,
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file: the trace, hardware and workload to compare on")],
    policies: Annotated[str | None, typer.Option("--policies", "-p", help="comma-separated policies (default: every registered one)")] = None,
    rates: Annotated[str | None, typer.Option("--rates", "-r", help="comma-separated cache rates, e.g. 0.125,0.25,0.5 (default: the scenario's)")] = None,
    set_: Annotated[list[str] | None, _SET] = None,
    metric: Annotated[str, typer.Option("--metric", "-m", help="rank on: tpot, ttft, throughput, hit-rate, bytes")] = "tpot",
    baseline: Annotated[str | None, typer.Option("--baseline", help="policy of the speed-up column (default: no-cache if compared, else the first)")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table on stdout: markdown or csv")] = "markdown",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output folder (default: runs/compare-<scenario>, "
                                             "or a timestamped one beside it if that holds another comparison)")] = None,
    jobs: Annotated[int | None, _JOBS] = None,
    dask: Annotated[str | None, _DASK] = None,
    figure: Annotated[bool, typer.Option(help="write compare.png and compare.pdf")] = True,
    seeds: Annotated[int, typer.Option("--seeds", help="replicate every point with seeds 0..N-1: tables and figures "
                                       "give the mean with a 95% interval, and ranks within it are ties")] = 1,
    progress: Annotated[bool | None, typer.Option(help="progress bar (default: a bar on a terminal, "
                                                   "else a line per few points with the time left)")] = None,
    force: Annotated[bool, typer.Option("--force", help="clear a non-empty --out folder and start afresh")] = False,
    allow_plugins: Annotated[bool, ALLOW_PLUGINS] = False,
) -> None:
    """Compare policies on one scenario: ranked tables in groups (lossless, lossy, bounds, n/a) and a figure."""
    from moesim.sim.core.atomic import atomic_file
    from moesim.sim.study.compare import METRICS, comparison_figure, comparison_sweep, rank
    from moesim.sim.study.compare_table import to_csv, to_markdown
    from moesim.sim.study.figure_files import save
    from moesim.sim.study.plot import load_table
    from moesim.sim.study.sweep_run import run_sweep

    grant_plugins(allow_plugins)
    if fmt not in ("markdown", "csv"):
        raise typer.BadParameter("choose markdown or csv", param_hint="--format")
    if metric not in METRICS:
        raise typer.BadParameter(f"choose from {', '.join(METRICS)}", param_hint="--metric")
    names = [p.strip() for p in policies.split(",") if p.strip()] if policies else None
    sweep = comparison_sweep(scenario, policies=names, rates=_floats(rates, "--rates"), sets=set_ or [], seeds=seeds)
    if baseline is not None:
        from moesim.policies.contract.registry import policy_names

        compared = names or policy_names()
        if baseline not in compared:
            raise MoesimError(f"--baseline {baseline}: not among the compared policies ({', '.join(compared)})")
    out_dir = _out_dir(out, sweep)
    with resumable(_command(ctx), out_dir, _kept(sweep, out_dir)):
        outcome = run_sweep(sweep, out_dir, jobs=jobs, dask=dask, progress=_show_progress(progress), force=force,
                            command=_command(ctx))
    df, _ = load_table(outcome.table)
    comp = rank(df, metric=metric, baseline=baseline)
    md, csv = to_markdown(comp), to_csv(comp)
    for name, text in (("compare.md", md), ("compare.csv", csv)):
        with atomic_file(out_dir / name, option="--out", force=True) as tmp:   # the study's own folder
            tmp.write_text(text)
    print(md if fmt == "markdown" else csv, end="")
    err = Console(stderr=True)
    written = [out_dir / "compare.md", out_dir / "compare.csv", outcome.table]
    if figure:
        written += save(comparison_figure(comp), out_dir, "compare")
    err.print("wrote " + ", ".join(visible(p) for p in written), highlight=False, markup=False)
    if outcome.not_applicable:
        n = len(outcome.not_applicable)
        err.print(f"{n} {'point' if n == 1 else 'points'} n/a on this trace and scenario (the table says why)",
                  highlight=False)
    if outcome.failed:
        err.print(f"{len(outcome.failed)} points failed (see the table)")


def plot_cmd(
    source: Annotated[Path, typer.Argument(help="a sweep folder or its results.parquet, or a `simctl run --out` folder (timeline)")],
    kind: Annotated[list[str] | None, typer.Option("--kind", "-k", help="tpot, throughput, hit-rate, bytes, speedup, latency-throughput (serving sweeps; repeatable; default: all that apply)")] = None,
    x: Annotated[str | None, typer.Option("--x", help="swept key on the x axis (default: cache rate, bandwidth... whichever varies)")] = None,
    hue: Annotated[str, typer.Option("--hue", help="one line per value of this column")] = "policy",
    facet: Annotated[str | None, typer.Option("--facet", help="one panel per value of this column")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="speed-up baseline (default: no-cache if present, else the first)")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output folder (default: <sweep>/figures or the run folder)")] = None,
    fmt: Annotated[list[str] | None, typer.Option("--format", "-f", help="png, pdf, svg, eps (repeatable; default: png and pdf; "
                                                                         "pdf, svg and eps are vector; a PNG and a vector file "
                                                                         "are always written, and older files of the figure "
                                                                         "in other formats drawn again)")] = None,
    start: Annotated[int, typer.Option(help="timeline: first iteration of the window")] = 0,
    iterations: Annotated[int, typer.Option(help="timeline: iterations in the window")] = 3,
    policies: Annotated[str | None, typer.Option("--policies", "-p", help="comma-separated policies to draw (default: all)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace the figures of an earlier plot (the --out folder, "
                                        "or the run folder's timeline figures)")] = False,
) -> None:
    """Paper-style figures from a sweep table, or the timeline view of one run."""
    from moesim.sim.core.atomic import OutputError, atomic_folder, own_folder
    from moesim.sim.study.figure_files import FORMATS, save
    from moesim.sim.study.figure_notes import figure_title
    from moesim.sim.study.plot import KINDS, load_table, sweep_figures
    from moesim.sim.study.serving_plot import (
        SERVING_KIND,
        is_serving_table,
        latency_throughput_figure,
    )
    from moesim.sim.study.timeline_plot import timeline_figure

    formats = fmt or list(FORMATS)
    if source.is_dir() and (source / "steps.parquet").is_file() and out is None:   # beside the run's files
        fig = timeline_figure(source, start=start, iterations=iterations)
        own_folder(source, option="plot", kind="run")
        there = [source / f"timeline.{f}" for f in formats if (source / f"timeline.{f}").exists()]
        if there and not force:
            raise OutputError(f"{there[0]}: exists (an earlier plot); add --force to replace it")
        paths = save(fig, source, "timeline", formats)
    else:
        timeline = source.is_dir() and (source / "steps.parquet").is_file()
        if not source.exists():
            raise MoesimError(f"{source}: no such file or folder")
        for k in kind or []:
            if k not in KINDS and k != SERVING_KIND:
                raise typer.BadParameter(f"{k}: choose from {', '.join([*KINDS, SERVING_KIND])}", param_hint="--kind")
        dest = out if out is not None else (source if source.is_dir() else source.parent) / "figures"
        if timeline:
            figures = [("timeline", timeline_figure(source, start=start, iterations=iterations))]
        else:
            picked = [p.strip() for p in policies.split(",") if p.strip()] if policies else None
            kinds = [k for k in kind or list(KINDS) if k != SERVING_KIND]
            figures = sweep_figures(source, kinds=kinds, x=x, hue=hue, facet=facet, baseline=baseline,
                                    policies=picked) if kinds else []
            table, _ = load_table(source)
            if SERVING_KIND in (kind or []) or (not kind and is_serving_table(table)):   # serving runs: latency vs throughput
                figures.append((SERVING_KIND.replace("-", "_"), latency_throughput_figure(
                    table, hue=hue, facet=facet, policies=picked, title=figure_title(table))))
        with atomic_folder(dest, option="--out", force=force, kind="figures") as tmp:
            drawn = [p for stem, fig in figures for p in save(fig, tmp, stem, formats)]
        paths = [dest / p.relative_to(tmp) for p in drawn]
    for p in paths:
        print(p)
    sys.stdout.flush()


def report_cmd(
    folder: Annotated[Path, typer.Argument(help="a sweep's or comparison's output folder (holding results.parquet)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="folder for report.html, report.md and report-figures/ (default: FOLDER)")] = None,
    metric: Annotated[str, typer.Option("--metric", "-m", help="rank on: tpot, ttft, throughput, hit-rate, bytes")] = "tpot",
    baseline: Annotated[str | None, typer.Option("--baseline", help="policy of the speed-up column (default: no-cache if present, else the first)")] = None,
) -> None:
    """One page per study: provenance, the command that made it, figures and the ranked tables
    with each row's warnings, as self-contained HTML (figures inline) and Markdown."""
    from moesim.sim.study.compare import METRICS
    from moesim.sim.study.report import write_report

    if metric not in METRICS:
        raise typer.BadParameter(f"choose from {', '.join(METRICS)}", param_hint="--metric")
    for p in write_report(folder, out, metric=metric, baseline=baseline):
        print(p)


def table_cmd(
    folder: Annotated[Path, typer.Argument(help="a sweep's or comparison's folder, or its results.parquet")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write here instead of stdout")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv or markdown")] = "csv",
    columns: Annotated[str | None, typer.Option("--columns", "-c", help="comma-separated columns (default: all)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing --out file that holds a table of "
                                        "this command")] = False,
) -> None:
    """A sweep's table as CSV (every row with its swept keys, join keys and metrics) or Markdown."""
    from moesim.sim.core.atomic import atomic_file, check_target
    from moesim.sim.study.plot import PlotError, load_table

    if fmt not in ("csv", "markdown"):
        raise typer.BadParameter("choose csv or markdown", param_hint="--format")
    df, _ = load_table(folder)
    known = {str(c) for c in df.columns}
    if out is not None:
        check_target(out, option="--out", folder=False, force=force, owned=lambda p: _holds_table(p, known))
    if columns:
        cols = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in cols if c not in df.columns]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(df.columns), n=1)
            raise PlotError(f"--columns {unknown[0]}: no such column" + (f"; did you mean {close[0]!r}?" if close else ""))
        df = df[cols]
    if fmt == "csv":   # a text cell a spreadsheet would run as a formula is guarded
        text = str(csv_safe(df).to_csv(index=False))
    else:
        from moesim.sim.study.compare_table import markdown_table

        rows = [["" if v is None or v != v else f"{v:.6g}" if isinstance(v, float) else str(v) for v in r]
                for r in df.itertuples(index=False)]
        text = "\n".join(markdown_table([str(c) for c in df.columns], rows)) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    with atomic_file(out, option="--out", force=force, owned=lambda p: _holds_table(p, known)) as tmp:
        tmp.write_text(text)
    print(out)


def _holds_table(path: Path, columns: set[str]) -> bool:
    """True when the file ``path`` starts with the header of a table ``simctl table`` writes
    (CSV or Markdown): every name in its first line is a column of the study's table."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline(100_000).strip()
    except (OSError, ValueError):
        return False
    names = [n.strip() for n in (first.strip("|").split("|") if first.startswith("|") else first.split(","))]
    return bool(first) and all(n in columns for n in names)
