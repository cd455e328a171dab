"""The timeline view of a ``simctl run --out`` folder: the GPU stream and each PCIe lane over a
few iterations (from ``timeline.json``) above every iteration's latency and stall (from
``steps.parquet``); Perfetto stays the deep view."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.run.outputs import COMPUTE_TRACKS
from moesim.sim.study.figure_files import FORMATS, PlotError, save
from moesim.sim.study.plot import print_style

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def _track_spans(timeline: dict[str, Any], t0_us: float, t1_us: float) -> dict[str, list[tuple[float, float, str]]]:
    names = {e["tid"]: e["args"]["name"] for e in timeline.get("traceEvents", [])
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tracks: dict[str, list[tuple[float, float, str]]] = {n: [] for n in names.values()}
    for e in timeline.get("traceEvents", []):
        if e.get("ph") != "X" or e["ts"] + e["dur"] < t0_us or e["ts"] > t1_us:
            continue
        track = names.get(e.get("tid"), str(e.get("tid")))
        args = e.get("args") or {}
        if "demand" in args:
            what = "demand load" if args["demand"] else "prefetch"
        elif track.startswith(COMPUTE_TRACKS):
            what = "experts" if "expert" in e["name"] else "attention / other"
        else:
            what = "other"
        tracks.setdefault(track, []).append((e["ts"], e["dur"], what))
    return tracks


SPAN_COLORS = {"attention / other": "0.65", "experts": "tab:blue", "demand load": "tab:red",
               "prefetch": "tab:green", "other": "tab:purple"}


def timeline_figure(run_dir: str | Path, *, start: int = 0, iterations: int = 3) -> Figure:
    """The timeline view of a ``simctl run --out`` folder (see the module docstring)."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.patches import Patch

    run = Path(run_dir)
    steps_path = run / "steps.parquet"
    if not steps_path.is_file():
        raise PlotError(f"{run}: no steps.parquet here (write one with simctl run --out)")
    steps = pd.read_parquet(steps_path)
    need = {"iteration", "t_start_us", "t_end_us", "stall_us"}
    if not need <= set(steps.columns):
        raise PlotError(f"{steps_path}: missing columns {', '.join(sorted(need - set(steps.columns)))}")
    per_it = steps.groupby("iteration").agg(t0=("t_start_us", "min"), t1=("t_end_us", "max"), stall=("stall_us", "sum"))
    if start < 0 or start >= len(per_it):
        raise PlotError(f"--start {start}: the run has iterations 0..{len(per_it) - 1}")
    window = per_it.iloc[start:start + max(1, iterations)]
    t0, t1 = float(window["t0"].min()), float(window["t1"].max())
    tl_path = run / "timeline.json"
    tracks = _track_spans(json.loads(tl_path.read_text()), t0, t1) if tl_path.is_file() else {}
    with print_style():
        rows = 2 if tracks else 1
        ratios = [max(1.0, 0.35 * len(tracks)), 1.6][-rows:]
        fig, axes = plt.subplots(rows, 1, figsize=(6.6, sum(ratios) + 0.8), squeeze=False,
                                 gridspec_kw={"height_ratios": ratios})
        if tracks:
            ax = axes[0][0]
            order = list(tracks)
            for row, track in enumerate(order):
                for what, color in SPAN_COLORS.items():
                    spans = [((s - t0) / 1e3, d / 1e3) for s, d, w in tracks[track] if w == what]
                    if spans:
                        ax.broken_barh(spans, (row - 0.38, 0.76), facecolors=color, edgecolor="white", linewidth=0.3)
            ax.set_yticks(range(len(order)), order)
            ax.set_ylim(len(order) - 0.5, -0.5)
            ax.set_xlim(0, (t1 - t0) / 1e3)
            ax.set_xlabel(f"time since iteration {start} began (ms)")
            ax.grid(axis="y", visible=False)
            ax.set_title(f"iterations {start}..{start + len(window) - 1}: GPU stream and copy lanes")
            used = {w for spans in tracks.values() for _, _, w in spans}
            ax.legend(handles=[Patch(color=c, label=w) for w, c in SPAN_COLORS.items() if w in used],
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax = axes[-1][0]
        dur_ms = (per_it["t1"] - per_it["t0"]) / 1e3
        stall_ms = per_it["stall"] / 1e3
        ax.fill_between(per_it.index, 0, dur_ms, step="mid", color="tab:blue", alpha=0.35, label="iteration time")
        ax.fill_between(per_it.index, 0, stall_ms, step="mid", color="tab:red", alpha=0.6, label="stall on transfers")
        if tracks:   # the span marks the iterations the panel above shows (none without timeline.json)
            ax.axvspan(start - 0.5, start + len(window) - 0.5, color="0.3", alpha=0.12, label="window above")
        else:
            ax.set_title("per iteration (simctl run --out DIR --timeline adds the GPU stream and copy lanes)")
        ax.set_xlabel("iteration")
        ax.set_ylabel("time (ms)")
        ax.set_xlim(per_it.index.min() - 0.5, per_it.index.max() + 0.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.tight_layout()
    return fig


def plot_timeline(run_dir: str | Path, out_dir: str | Path | None = None, *, start: int = 0, iterations: int = 3,
                  formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the timeline view of a run folder as ``timeline.<format>`` (default: in the folder)."""
    fig = timeline_figure(run_dir, start=start, iterations=iterations)
    return save(fig, out_dir if out_dir is not None else run_dir, "timeline", formats)
