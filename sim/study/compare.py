"""``simctl compare``: every registered policy (or a list) on one scenario's trace and hardware,
at one or several cache rates, as a ranked table and a figure.

The comparison is a sweep (policy x cache rate over the scenario) run through
:mod:`moesim.sim.study.sweep_run`, so it runs in parallel, resumes, and leaves the same tidy table for
``simctl plot``. Within each cache rate, the policies that could really run are ranked on the
chosen metric; oracle policies are listed after them as bounds, unranked, and failed points
last with their error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.study.plot import KINDS, default_baseline, series_label
from moesim.sim.study.sweep import ALL, Sweep, SweepError, SweepSpec, expand

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


def rank(df: pd.DataFrame, *, metric: str = "tpot", baseline: str | None = None) -> Comparison:
    """Rank the policies of a comparison table within each cache rate (see the module docstring)."""
    import pandas as pd

    column, higher = _column(metric)
    has_rates = "cache.rate" in df.columns
    group = "cache.rate" if has_rates else None
    names = list(dict.fromkeys(df["policy"]))
    base = baseline or default_baseline([n for n, b in zip(df["policy"], df["bound"], strict=True) if not b] or names)
    if base not in names:
        raise SweepError(f"--baseline {base}: not among the compared policies ({', '.join(names)})")
    parts = []
    for _, g in (df.groupby(group, sort=True) if group else [(None, df)]):
        g = g.copy()
        ok = g["status"] == "ok"
        real = g[ok & ~g["bound"].astype(bool)].sort_values(column, ascending=not higher)
        bounds = g[ok & g["bound"].astype(bool)].sort_values(column, ascending=not higher)
        failed = g[~ok]
        real = real.assign(rank=range(1, len(real) + 1))
        bounds = bounds.assign(rank=None)
        failed = failed.assign(rank=None)
        base_rows = g[(g["policy"] == base) & ok]
        ordered = [x for x in (real, bounds, failed) if not x.empty]
        out = pd.concat(ordered)
        base_tpot = float(base_rows["tpot_ms_mean"].iloc[0]) if not base_rows.empty else float("nan")
        out["speedup"] = base_tpot / out["tpot_ms_mean"].astype(float)
        parts.append(out)
    frame = pd.concat(parts, ignore_index=True)
    return Comparison(frame=frame, metric=metric, baseline=base, rates=has_rates)


def _kind(name: str, bound: bool) -> str:
    from moesim.policies.contract.registry import policy_class

    if bound:
        return "oracle bound"
    return "lossy" if policy_class(name).lossy else "lossless"


def _num(v: Any, fmt: str, scale: float = 1.0) -> str:
    if v is None or v != v:  # None or NaN
        return "-"
    return format(float(v) * scale, fmt)


def table_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the ranked table."""
    head = (["cache rate"] if comp.rates else []) + [
        "rank", "policy", "kind", "TPOT ms", "TPOT p99 ms", "TTFT ms", "tokens/s", "hit %", "late %",
        "miss %", "stall ms/token", "H2D MB/token", f"speed-up vs {comp.baseline}"]
    rows = []
    for r in comp.frame.to_dict("records"):
        bound = bool(r["bound"])
        if r["status"] != "ok":
            rows.append(([_num(r.get("cache.rate"), "g")] if comp.rates else [])
                        + ["n/a" if r["status"] == "n/a" else "failed", str(r["policy"]), _kind(str(r["policy"]), bound), str(r.get("error")), *["-"] * 9])
            continue
        rk = "bound" if bound else str(int(r["rank"]))
        rows.append(([_num(r.get("cache.rate"), "g")] if comp.rates else []) + [
            rk, series_label(str(r["policy"]), bound), _kind(str(r["policy"]), bound),
            _num(r.get("tpot_ms_mean"), ".2f"), _num(r.get("tpot_ms_p99"), ".2f"), _num(r.get("ttft_ms_mean"), ".2f"),
            _num(r.get("tokens_per_s"), ".1f"), _num(r.get("hit_rate"), ".1f", 100), _num(r.get("late_rate"), ".1f", 100),
            _num(r.get("miss_rate"), ".1f", 100), _num(r.get("stall_ms_per_token"), ".2f"),
            _num(r.get("h2d_gb_per_token"), ".1f", 1e3), _num(r.get("speedup"), ".2f")])
    return head, rows


def to_markdown(comp: Comparison) -> str:
    """The ranked table as GitHub markdown."""
    head, rows = table_rows(comp)
    right = {i for i, h in enumerate(head) if h not in ("policy", "kind", "rank")}
    lines = ["| " + " | ".join(head) + " |",
             "| " + " | ".join("---:" if i in right else "---" for i in range(len(head))) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    note = (f"\nRanked by {comp.metric} within each cache rate; oracle policies are bounds (they read the future) "
            "and are not ranked.")
    return "\n".join(lines) + "\n" + note + "\n"


def to_csv(comp: Comparison) -> str:
    """The ranked table as CSV with raw numbers (rates as fractions, times in ms)."""
    cols = [c for c in (["cache.rate"] if comp.rates else []) + [
        "rank", "policy", "bound", "status", "tpot_ms_mean", "tpot_ms_p99", "ttft_ms_mean", "tokens_per_s",
        "hit_rate", "late_rate", "miss_rate", "stall_ms_per_token", "h2d_gb_per_token", "speedup", "error",
        "config_hash"] if c in comp.frame.columns]
    out = comp.frame[cols].copy()
    out["kind"] = [_kind(str(n), bool(b)) for n, b in zip(out["policy"], out["bound"], strict=True)]
    return str(out.to_csv(index=False))


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
