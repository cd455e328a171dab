"""The predicted-against-measured figure of ``simctl fit`` (``fit.png``).

One point per measurement on log axes, with y = x and the band within a factor 1.5 shaded;
fit rows are filled circles, held-out (test) rows open squares, one colour per metric; a
held-out row without a prediction (an undefined ratio: a miss) is a triangle on the top edge.
The legend gives each role's median |error| and largest ratio, so the figure reads on its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.study.fit import FitResult

BAND = 1.5


def fit_figure(result: FitResult, path: Path) -> Path:
    """Draw the figure of ``result`` into ``path`` (PNG)."""
    from matplotlib.figure import Figure

    from moesim.sim.study.plot import print_style

    metrics = list(dict.fromkeys(m.metric for m in result.measures))
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    with print_style():
        fig = Figure(figsize=(4.2, 4.0))
        ax = fig.add_subplot()
        xs = [m.measured for m in result.measures]
        ys = [y for y in result.predicted if math.isfinite(y) and y > 0]
        lo = min(xs + ys) / (BAND * 1.15)
        hi = max(xs + ys) * BAND * 1.15
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.fill_between([lo, hi], [lo / BAND, hi / BAND], [lo * BAND, hi * BAND], color="0.9", lw=0,
                        label=f"within {BAND:g}x")
        ax.plot([lo, hi], [lo, hi], color="0.3", lw=0.8, label="predicted = measured")
        summaries = {"fit": result.fit_error, "test": result.held_out}
        for role, marker in (("fit", "o"), ("test", "s")):
            summ = summaries[role]
            for k, metric in enumerate(metrics):
                pts = [(m.measured, p) for m, p in zip(result.measures, result.predicted, strict=True)
                       if m.row.role == role and m.metric == metric]
                undefined = [x for x, y in pts if not (math.isfinite(y) and y > 0)]
                pts = [(x, y) for x, y in pts if math.isfinite(y) and y > 0]
                if undefined:
                    ax.scatter(undefined, [hi / 1.08] * len(undefined), marker="^", s=26, zorder=3, clip_on=False,
                               color=colours[k % len(colours)], label=f"{role}, {metric}: no prediction (a miss)")
                if not pts:
                    continue
                colour = colours[k % len(colours)]
                tail = ""
                if summ is not None and summ.rows and summ.max_ratio is not None:
                    tail = f": median |err| {summ.median_abs_error_pct:.1f}%, max {summ.max_ratio:.2f}x"
                name = f"{role} ({'held out' if role == 'test' else 'seen by the fit'})"
                label = f"{name}, {metric}" + (tail if k == 0 else "")
                ax.scatter([x for x, _ in pts], [y for _, y in pts], marker=marker, s=22, label=label, zorder=3,
                           facecolors=colour if role == "fit" else "none", edgecolors=colour, linewidths=1.0)
        from matplotlib.ticker import FuncFormatter, LogLocator

        for axis in (ax.xaxis, ax.yaxis):   # ticks at 1, 2, 5 x 10^n, written as plain numbers
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted by the simulator")
        ax.set_title(f"{result.ms.spec.name}\n{len(result.values)} fitted values, {result.fit_error.rows} fit rows")
        ax.legend(loc="upper left", frameon=False, fontsize=6)
        fig.tight_layout()
        fig.savefig(path, format="png", bbox_inches="tight")
    return path
