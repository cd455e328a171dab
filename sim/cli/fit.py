"""``simctl fit``: fit scenario values to measurements (:mod:`moesim.sim.study.fit`).

Registered lazily in :mod:`moesim.sim.cli.main`; scipy and matplotlib load only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from moesim.sim.cli.plugin_option import ALLOW_PLUGINS, grant_plugins

if TYPE_CHECKING:
    from moesim.sim.study.fit import LooMethod


def fit_cmd(
    measurements: Annotated[Path, typer.Argument(help="measurement YAML file (base scenario, fit: bounds, rows)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder: fitted.yaml, rows.csv, fit.png")],
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="worker processes: the grid's runs, independent groups and leave-one-out refits in parallel")] = 1,
    grid: Annotated[int | None, typer.Option("--grid", help="coarse-start points per fitted key (default: 5 for 1-2 keys, fewer beyond)")] = None,
    max_evals: Annotated[int, typer.Option("--max-evals", help="most objective evaluations of the least-squares refinement")] = 40,
    diff_step: Annotated[float, typer.Option("--diff-step", help="finite-difference step, relative to each value")] = 0.03,
    loo: Annotated[str, typer.Option("--loo", help="leave-one-out: refit (each fit row left out, the fit refined without it), one-step (one Gauss-Newton step: cheaper, approximate), none")] = "refit",
    force: Annotated[bool, typer.Option("--force", help="replace an existing non-empty --out folder")] = False,
    allow_plugins: Annotated[bool, ALLOW_PLUGINS] = False,
    progress: Annotated[bool | None, typer.Option(help="progress on stderr, each phase with the time it has left (default: a bar on a terminal, else a line every few runs)")] = None,
) -> None:
    """Fit declared scenario values to measured results by running the simulator; judge the fit on held-out rows."""
    from rich.console import Console

    from moesim.sim.cli.study import _show_progress
    from moesim.sim.core.atomic import check_target
    from moesim.sim.study.fit import fit_measurements
    from moesim.sim.study.fit_output import report, write_fit
    from moesim.sim.study.fit_progress import FitProgress
    from moesim.sim.study.fit_spec import load_measurements

    grant_plugins(allow_plugins)
    if loo not in ("one-step", "refit", "none"):
        raise typer.BadParameter("choose refit, one-step or none", param_hint="--loo")
    for value, option, low in ((jobs, "--jobs", 1), (grid, "--grid", 2), (max_evals, "--max-evals", 1)):
        if value is not None and value < low:
            raise typer.BadParameter(f"must be at least {low}", param_hint=option)
    if not 0 < diff_step < 1:
        raise typer.BadParameter("must be between 0 and 1 (a fraction of each value)", param_hint="--diff-step")
    check_target(out, option="--out", folder=True, force=force)
    ms = load_measurements(measurements)
    with FitProgress(ms.spec.name, _show_progress(progress)) as shown:
        result = fit_measurements(ms, jobs=jobs, grid=grid, max_evals=max_evals,
                                  diff_step=diff_step, loo=cast("LooMethod", loo), progress=shown)
    paths = write_fit(result, out, force=force)
    console = Console() if Console().is_terminal else Console(width=160)
    report(result, console)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
