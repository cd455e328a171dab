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


def comparison_sweep(scenario: str | Path, *, policies: Sequence[str] | None = None,
                     rates: Sequence[float] | None = None, sets: Sequence[str] = ()) -> Sweep:
    """The sweep behind a comparison: policy (all registered, or the list) x cache rate."""
    path = Path(scenario)
    if not path.is_file():
        raise SweepError(f"{path}: no such scenario file")
    grid: dict[str, Any] = {"policy": list(dict.fromkeys(policies)) if policies else ALL}
    if rates:
        grid["cache.rate"] = list(dict.fromkeys(rates))
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


def rank(df: pd.DataFrame, *, metric: str = "tpot", baseline: str | None = None) -> Comparison:
    """Rank the policies of a comparison table within each cache rate and group (see
    :data:`GROUPS`): lossless and lossy policies are ranked apart, oracles are bounds (no rank),
    then the points that did not run (n/a, with the reason) and the failed ones."""
    import pandas as pd

    column, higher = _column(metric)
    df = df.assign(kind=point_kinds(df))
    has_rates = "cache.rate" in df.columns
    group = "cache.rate" if has_rates else None
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
            ordered.append(part.assign(rank=range(1, len(part) + 1) if kind != "oracle" else None))
        ordered.append(g[g["status"] == NOT_APPLICABLE].assign(rank=None))
        ordered.append(g[~ok & (g["status"] != NOT_APPLICABLE)].assign(rank=None))
        out = pd.concat([x for x in ordered if not x.empty])
        base_rows = g[(g["policy"] == base) & ok]
        base_tpot = float(base_rows["tpot_ms_mean"].iloc[0]) if not base_rows.empty else float("nan")
        out["speedup"] = base_tpot / out["tpot_ms_mean"].astype(float)
        parts.append(out)
    frame = pd.concat(parts, ignore_index=True)
    return Comparison(frame=frame, metric=metric, baseline=base, rates=has_rates)


def comparison_figure(comp: Comparison) -> Any:
    """TPOT and hit rate against cache rate per policy, or ranked bars at a single rate."""
    from moesim.sim.study.plot import (
        draw_lines,
        legend_outside,
        print_style,
        ranked_bars,
        series_styles,
        summarise,
    )

    ok = comp.frame[comp.frame["status"] == "ok"]
    if not comp.rates or ok["cache.rate"].nunique() < 2:
        return ranked_bars(ok, comp.metric if comp.metric in KINDS else "tpot")
    import matplotlib.pyplot as plt

    styles = series_styles(list(dict.fromkeys(ok["policy"])))
    with print_style():
        fig, axes = plt.subplots(1, 2, figsize=(6.6, 2.5))
        for ax, k in zip(axes, ("tpot", "hit-rate"), strict=True):
            kind = KINDS[k]
            draw_lines(ax, summarise(ok, "cache.rate", "policy", None, kind.column), "cache.rate", "policy", kind, styles)
            ax.set_xlabel("expert cache (fraction of routed-expert bytes)")
            ax.set_ylabel(kind.label)
        fig.tight_layout()
        legend_outside(fig, axes[-1])
    return fig
