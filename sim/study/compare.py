"""``simctl compare``: every registered policy (or a list) on one scenario's trace and hardware,
at one or several cache rates, as a ranked table and a figure.

The comparison is a sweep (policy x cache rate over the scenario) run through
:mod:`moesim.sim.study.sweep_run`, so it runs in parallel, resumes, and leaves the same tidy table for
``simctl plot``; like any sweep, each policy runs with its paper's setup defaults where the
scenario leaves them unset, or is ``n/a`` with the reason (:mod:`moesim.sim.study.needs`).
Within each cache rate, lossless policies are ranked on the chosen metric, lossy ones apart
(:data:`GROUPS`); oracle policies are listed as bounds, unranked; then the points that did not
run and the failed ones. The tables are :mod:`moesim.sim.study.compare_table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.study.plot import KINDS, default_baseline, point_kinds
from moesim.sim.study.sweep import ALL, Sweep, SweepError, SweepSpec, expand
from moesim.sim.study.sweep_run import NOT_APPLICABLE

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

METRICS = ("tpot", "ttft", "throughput", "hit-rate", "bytes")
"""What a comparison may be ranked on (``--metric``); ``ttft`` is the mean time to first token."""


@dataclass
class Comparison:
    """A finished comparison: the ranked frame, the metric it is ranked on and the baseline."""

    frame: pd.DataFrame
    metric: str
    baseline: str | None
    rates: bool
    by: list[str]
    """The columns ranked within (``cache.rate`` in a comparison; every swept key but the
    policy's in a sweep's report)."""


def comparison_sweep(scenario: str | Path, *, policies: Sequence[str] | None = None,
                     rates: Sequence[float] | None = None, sets: Sequence[str] = (), seeds: int = 1) -> Sweep:
    """The sweep behind a comparison: policy (all registered, or the list) x cache rate, x
    seeds ``0 .. seeds-1`` when ``seeds`` > 1 (replicates, folded by :func:`rank`)."""
    path = Path(scenario)
    if not path.is_file():
        raise SweepError(f"{path}: no such scenario file")
    if seeds < 1:
        raise SweepError(f"--seeds: {seeds} is not a count of seeds (give 1 or more)")
    grid: dict[str, Any] = {"policy": list(dict.fromkeys(policies)) if policies else ALL}
    if rates:
        grid["cache.rate"] = list(dict.fromkeys(rates))
    if seeds > 1:
        grid["seed"] = list(range(seeds))
    spec = SweepSpec(name=f"compare-{path.stem}", base=str(path.resolve()), grid=grid)
    return expand(spec, source=f"compare {path}", base_dir=path.resolve().parent, extra_sets=list(sets))


def _column(metric: str) -> tuple[str, bool]:
    if metric not in METRICS:
        raise SweepError(f"--metric {metric}: choose from {', '.join(METRICS)}")
    if metric == "ttft":
        return "ttft_ms_mean", False
    kind = KINDS[metric]
    return kind.column, kind.higher_is_better


GROUPS = ("lossless", "lossy", "oracle")
"""The groups a comparison ranks apart, in table order: policies that run every routed expert,
policies that run other experts than routed (speed bought with routing mass), and oracles
(bounds: they read the future)."""


def rank(df: pd.DataFrame, *, metric: str = "tpot", baseline: str | None = None,
         by: Sequence[str] | None = None) -> Comparison:
    """Rank the policies of a comparison table within each cache rate (or each combination of
    the ``by`` columns) and group (see :data:`GROUPS`): lossless and lossy policies are ranked
    apart, oracles are bounds (no rank), then the points that did not run (n/a, with the reason)
    and the failed ones. Replicated seeds are first folded into their mean with a 95% interval
    (:func:`~moesim.sim.study.replicates.merge_seeds`); ``tied`` marks the ranks shared within
    the interval or 1% (:func:`~moesim.sim.study.replicates.tie_ranks`)."""
    import pandas as pd

    from moesim.sim.study.replicates import SEED, merge_seeds, tie_ranks

    column, higher = _column(metric)
    keys = [c for c in (by if by is not None else ["cache.rate"]) if c in df.columns and c != SEED]
    df = merge_seeds(df, keys)
    df = df.assign(kind=point_kinds(df))
    has_rates = "cache.rate" in keys
    group: list[str] | None = keys or None
    names = list(dict.fromkeys(df["policy"]))
    lossless = [n for n, k in zip(df["policy"], df["kind"], strict=True) if k == "lossless"]
    base = baseline or default_baseline(lossless or names)
    if base not in names:
        raise SweepError(f"--baseline {base}: not among the compared policies ({', '.join(names)})")
    parts = []
    for _, g in (df.groupby(group, sort=True) if group else [(None, df)]):
        ok = g["status"] == "ok"
        ordered = []
        for kind in GROUPS:
            part = g[ok & (g["kind"] == kind)].sort_values(column, ascending=not higher)
            ci = part[f"{column}_ci95"] if f"{column}_ci95" in part.columns else None
            ranks = tie_ranks(part[column].tolist(), None if ci is None else ci.tolist())
            ordered.append(part.assign(rank=[r for r, _ in ranks] if kind != "oracle" else None,
                                       tied=[t for _, t in ranks] if kind != "oracle" else False))
        ordered.append(g[g["status"] == NOT_APPLICABLE].assign(rank=None))
        ordered.append(g[~ok & (g["status"] != NOT_APPLICABLE)].assign(rank=None))
        out = pd.concat([x for x in ordered if not x.empty])
        base_rows = g[(g["policy"] == base) & ok]
        base_tpot = float(base_rows["tpot_ms_mean"].iloc[0]) if not base_rows.empty else float("nan")
        out["speedup"] = base_tpot / out["tpot_ms_mean"].astype(float)
        parts.append(out)
    frame = pd.concat(parts, ignore_index=True)
    return Comparison(frame=frame, metric=metric, baseline=base, rates=has_rates, by=keys)


def comparison_figure(comp: Comparison) -> Any:
    """TPOT and hit rate against cache rate per policy, or ranked bars at a single rate; titled
    with the model, hardware and trace, naming the policies without a result."""
    from moesim.sim.study.figure_notes import caption, figure_title, interval_note, missing_note
    from moesim.sim.study.plot import (
        draw_lines,
        greyed_note,
        highlight,
        outlier_note,
        plain_log_axis,
        print_style,
        ranked_bars,
        series_styles,
        summarise,
        swept_ticks,
    )

    ok = comp.frame[comp.frame["status"] == "ok"]
    if not comp.rates or ok["cache.rate"].nunique() < 2:
        return ranked_bars(ok, comp.metric if comp.metric in KINDS else "tpot")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(str(p) for p in ok["policy"]))
    styles = series_styles(names)
    lines: list[str | None] = []
    with print_style():
        fig, axes = plt.subplots(1, 2, figsize=(6.6, 2.5))
        for ax, k in zip(axes, ("tpot", "hit-rate"), strict=True):
            kind = KINDS[k]
            summary = summarise(ok, "cache.rate", "policy", None, kind.column)
            shown = highlight(summary, "policy", kind)
            log = outlier_note(summary, "policy", kind, "TPOT") if k == "tpot" else None
            draw_lines(ax, summary, "cache.rate", "policy", kind, styles, shown)
            ax.set_xlabel("expert cache (fraction of routed-expert bytes)")
            ax.set_ylabel(kind.label + (", log scale" if log else ""))
            if log:
                plain_log_axis(ax)
            swept_ticks(ax, ok["cache.rate"].tolist())
            grey = greyed_note(names, shown, kind)
            lines += [log, f"{kind.label.split(' (')[0]}: {grey}" if grey else None]
        title = figure_title(comp.frame)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        caption(fig, [*lines, interval_note(summary), missing_note(comp.frame, "policy", names)], 6.6)
        handles: dict[str, Any] = {}
        for ax in axes:     # the legend of both panels: each shows its own best in colour
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(lab, h)
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="upper left", bbox_to_anchor=(1.0, 0.95),
                       frameon=False)
    return fig
