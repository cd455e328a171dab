"""The latency-throughput figure of a serving sweep (a sweep over ``workload.arrivals.rate``):
for each policy, the tail latency its requests see against the throughput it delivers, one point
per arrival rate. Two panels: TTFT p99 and TPOT p50 (ms, log scale), both against output tokens
per second; with ``facet`` one row of panels per value (a cache size, say). Points of the same
(policy, rate) from other swept keys (seeds) are averaged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moesim.sim.study.figure_files import PlotError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure

SERVING_KIND = "latency-throughput"
"""The ``simctl plot --kind`` of this figure (drawn by default for a table of serving runs)."""

RATE = "workload.arrivals.rate"
THROUGHPUT = "serving_output_tokens_per_s"
PANELS = (("serving_ttft_ms_p99", "TTFT p99 (ms)"), ("serving_tpot_ms_p50", "TPOT p50 (ms)"))


def is_serving_table(df: pd.DataFrame) -> bool:
    """Whether ``df`` (a sweep table) holds serving runs with their throughput and latencies."""
    return THROUGHPUT in df.columns and all(col in df.columns for col, _ in PANELS)


def latency_throughput_figure(df: pd.DataFrame, *, hue: str = "policy", facet: str | None = None,
                              policies: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """The figure (see the module) of the finished serving runs of ``df``."""
    import matplotlib.pyplot as plt

    from moesim.sim.study.plot import legend_outside, pick_policies, print_style, series_styles

    if not is_serving_table(df):
        raise PlotError(f"--kind {SERVING_KIND}: the table has no serving runs (sweep workload.arrivals.rate "
                        "over a scenario with workload.arrivals)")
    if facet is not None and facet not in df.columns:
        raise PlotError(f"--facet {facet}: not a column of this table")
    ok = pick_policies(df, policies)
    ok = ok[ok["status"] == "ok"]
    if ok.empty:
        raise PlotError("no finished point in the table")
    keys = [k for k in (facet, hue, RATE) if k is not None and k in ok.columns]
    cols = [THROUGHPUT, *(c for c, _ in PANELS)]
    mean = ok.groupby(keys, sort=True)[cols].mean().reset_index()
    names = list(dict.fromkeys(ok[hue].astype(str)))
    styles = series_styles(names, policies=hue == "policy")
    facets = list(dict.fromkeys(mean[facet])) if facet else [None]
    with print_style():
        fig, axes = plt.subplots(len(facets), len(PANELS), figsize=(7.2, 2.6 * len(facets)), squeeze=False)
        for row, fv in zip(axes, facets, strict=True):
            part = mean if fv is None else mean[mean[facet] == fv]
            for ax, (col, label) in zip(row, PANELS, strict=True):
                for name in names:
                    line = part[part[hue].astype(str) == name]
                    if line.empty:
                        continue
                    color, marker = styles[name]
                    ax.plot(line[THROUGHPUT], line[col], color=color, marker=marker, markersize=4,
                            linewidth=1.2, label=name)
                ax.set_yscale("log")
                ax.set_xlabel("throughput (output tokens/s)")
                ax.set_ylabel(label)
                if fv is not None:
                    ax.set_title(f"{facet} = {fv}")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        legend_outside(fig, axes[0][-1])
    return fig
