"""The words around a figure of a sweep table: its title (the model, hardware and trace the
points ran on) and the caption's notes under the axes (error bars, series with no result),
shared by the sweep figures (:mod:`moesim.sim.study.plot`), the comparisons and the reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


TITLE_COLUMNS = (("model_name", "model"), ("hardware_name", "hardware"), ("trace_name", "trace"))
"""The join keys a figure's title names (:data:`moesim.sim.run.runner.JOIN_KEYS`)."""


def figure_title(df: pd.DataFrame) -> str | None:
    """``flame-moe-290m on rtx-4090, trace flame-moe-290m.parquet``: the model, hardware and
    trace of a table's finished points (several values joined with ``/``); None for a table
    written before runs carried them."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    parts = {}
    for col, what in TITLE_COLUMNS:
        if col in ok.columns:
            vals = [str(v) for v in dict.fromkeys(ok[col].dropna())]
            if vals:
                parts[what] = " / ".join(vals)
    if not parts:
        return None
    head = parts.get("model", "")
    if "hardware" in parts:
        head = f"{head} on {parts['hardware']}" if head else parts["hardware"]
    if "trace" in parts:
        head = f"{head}, trace {parts['trace']}" if head else f"trace {parts['trace']}"
    return head


def missing_note(df: pd.DataFrame, hue: str, shown: Sequence[str]) -> str | None:
    """``no result: moepic (n/a), fmoe (failed)``: the series of the table with no finished
    point, so that none vanishes from a figure without a word."""
    if hue not in df.columns:
        return None
    gone = []
    for name, g in df.groupby(hue, sort=False):
        if str(name) in shown:
            continue
        status = "n/a" if (g["status"] == "n/a").all() else "failed"
        gone.append(f"{name} ({status})")
    return ("no result: " + ", ".join(gone)) if gone else None


def interval_note(summary: pd.DataFrame) -> str | None:
    """The caption line saying what error bars mean, when any were drawn."""
    n = int(summary["count"].max()) if len(summary) else 0
    return f"Error bars: 95% interval of the mean over {n} points (seeds or other swept keys)." if n > 1 else None


def caption(fig: Figure, lines: Sequence[str | None], width_in: float) -> None:
    """Notes under the figure (below the axes and their labels, wrapped to its width)."""
    import textwrap

    text = "\n".join(textwrap.fill(ln, width=max(40, int(width_in * 17))) for ln in lines if ln)
    if text:
        fig.text(0.0, -0.02, text, ha="left", va="top", fontsize=6.5, color="0.3")
