"""Paper-style figures from a sweep table, and a timeline view of one run.

Sweep figures (one file per kind and format): TPOT, throughput, hit rate and host-to-device
bytes per token against a swept axis (cache rate, PCIe bandwidth...), one line per policy, and
the speed-up over a baseline policy. Each policy's group (the table's ``kind``) sets its line:
lossless solid, lossy dashed and labelled ``(lossy)``, oracle policies dotted with hollow
markers and labelled as bounds.
Swept keys other than the x axis, the line key and the facet are averaged, with the standard
deviation as error bars (several seeds). Figures are sized for a printed column, with axis
labels in units and the legend outside the data.

The timeline view of a ``simctl run --out`` folder draws the GPU stream and each PCIe lane over
a few iterations (from ``timeline.json``) above every iteration's latency and stall (from
``steps.parquet``); Perfetto stays the deep view.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PARAMS_META = b"moesim.params"
FORMATS = ("png", "pdf")


class PlotError(MoesimError, ValueError):
    """A table or run folder that cannot be plotted as asked; the message names the culprit."""


@dataclass(frozen=True)
class Kind:
    """One sweep figure: the column it plots, its axis label, a scale and its direction."""

    column: str
    label: str
    scale: float = 1.0
    higher_is_better: bool = False


KINDS: dict[str, Kind] = {
    "tpot": Kind("tpot_ms_mean", "TPOT, mean (ms)"),
    "throughput": Kind("tokens_per_s", "throughput (tokens/s)", higher_is_better=True),
    "hit-rate": Kind("hit_rate", "expert hit rate (%)", 100.0, higher_is_better=True),
    "bytes": Kind("h2d_gb_per_token", "host-to-device traffic (MB/token)", 1e3),
    "speedup": Kind("speedup", "speed-up in TPOT (x)", higher_is_better=True),
}
AXIS_LABELS = {
    "cache.rate": "expert cache (fraction of routed-expert bytes)",
    "cache.experts_per_layer": "cached experts per layer",
    "cache.gib": "expert cache (GiB)",
    "cache.buffer_experts": "transfer buffer (experts)",
    "hardware.pcie_gbps": "host-to-device bandwidth (GB/s)",
    "hardware.pcie_latency_us": "transfer latency (µs)",
    "hardware.copy_engines": "copy engines",
    "workload.batch_size": "batch size (requests)",
    "seed": "seed",
}
PREFERRED_X = ("cache.rate", "cache.experts_per_layer", "cache.gib", "hardware.pcie_gbps", "workload.batch_size")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p", "d", "8", "H", "1")


@contextmanager
def print_style() -> Iterator[None]:
    """Matplotlib settings for figures read in print: small fonts, thin grid, embedded fonts."""
    import matplotlib.pyplot as plt

    with plt.rc_context({
        "font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8.5, "legend.fontsize": 7,
        "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.3, "lines.markersize": 4,
        "axes.grid": True, "grid.linewidth": 0.4, "grid.alpha": 0.5, "axes.spines.top": False,
        "axes.spines.right": False, "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.dpi": 200,
        "figure.dpi": 110,
    }):
        yield


def axis_label(key: str) -> str:
    """The axis label of a swept key, with its unit."""
    return AXIS_LABELS.get(key, key)


def series_label(name: str, bound: bool, kind: str | None = None) -> str:
    """A legend entry: oracle policies are marked as bounds, lossy ones as lossy."""
    if bound or kind == "oracle":
        return f"{name} (bound)"
    return f"{name} (lossy)" if kind == "lossy" else str(name)


LINESTYLES = {"lossless": "-", "lossy": "--", "oracle": ":"}
"""The line of each policy group (:data:`moesim.sim.study.compare.GROUPS`)."""


def point_kinds(df: pd.DataFrame) -> list[str]:
    """Each row's group (``lossless``, ``lossy``, ``oracle``): the table's ``kind`` column, or,
    for a table written before it had one, the registered policy's (``oracle`` for a bound)."""
    if "kind" in df.columns:
        return [str(k) for k in df["kind"]]
    from moesim.policies.contract.registry import PolicyError, policy_class

    out = []
    for name, bound in zip(df["policy"], df["bound"], strict=True):
        if bool(bound):
            out.append("oracle")
            continue
        try:
            out.append("lossy" if policy_class(str(name)).lossy else "lossless")
        except PolicyError:   # a plugin policy not loaded here
            out.append("lossless")
    return out


def default_baseline(names: Sequence[str]) -> str:
    """The baseline of speed-ups: on-demand loading (``no-cache``) when present, else the first."""
    if not names:
        raise PlotError("no policy to take as the baseline")
    return "no-cache" if "no-cache" in names else names[0]


# --- reading tables -------------------------------------------------------------------------------
def load_table(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """A sweep table (a ``results.parquet`` file or a sweep folder holding one) and its swept keys."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        p = p / "results.parquet"
    if not p.is_file():
        raise PlotError(f"{path}: no sweep table (results.parquet) here")
    try:
        table = pq.read_table(p)
    except Exception as exc:
        raise PlotError(f"{p}: not a Parquet table ({' '.join(str(exc).split())})") from None
    meta = table.schema.metadata or {}
    df = table.to_pandas()
    if "policy" not in df.columns or "status" not in df.columns:
        raise PlotError(f"{p}: not a moesim sweep table (no policy and status columns)")
    params = json.loads(meta[PARAMS_META]) if PARAMS_META in meta else []
    return df, [c for c in params if c in df.columns]


def _pick_x(df: pd.DataFrame, params: list[str], hue: str, x: str | None) -> str:
    if x is not None:
        if x not in df.columns:
            raise PlotError(f"--x {x}: no such column; swept keys: {', '.join(params) or 'none'}")
        return x
    varying = [c for c in params if c != hue and df[c].nunique() > 1 and _numeric(df[c])]
    for c in PREFERRED_X:
        if c in varying:
            return c
    if varying:
        return varying[0]
    raise PlotError("no numeric swept key to put on the x axis; sweep one (cache.rate, hardware.pcie_gbps...) or give --x")


def _numeric(col: pd.Series) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(col)) and not pd.api.types.is_bool_dtype(col)


def with_speedup(df: pd.DataFrame, hue: str, x: str, group: list[str], baseline: str) -> pd.DataFrame:
    """Add ``speedup`` = the baseline's mean TPOT / each row's, matched on ``x`` and ``group``."""
    if baseline not in set(df[hue].astype(str)):
        raise PlotError(f"--baseline {baseline}: not in the table's {hue} column")
    keys = [x, *group]
    base = df[df[hue].astype(str) == baseline].groupby(keys, dropna=False)["tpot_ms_mean"].mean().rename("_base")
    out = df.join(base, on=keys)
    out["speedup"] = out["_base"] / out["tpot_ms_mean"]
    return out.drop(columns="_base")


def summarise(df: pd.DataFrame, x: str, hue: str, facet: str | None, column: str) -> pd.DataFrame:
    """Mean and standard deviation of ``column`` per (facet, hue, x), over every other swept key."""
    keys = [k for k in (facet, hue, x) if k]
    g = df.assign(kind=point_kinds(df)).groupby(keys, dropna=False, sort=False)
    out = g[column].agg(["mean", "std", "count"]).reset_index()
    out["bound"] = g["bound"].first().to_numpy()
    out["kind"] = g["kind"].first().to_numpy()
    return out


# --- drawing --------------------------------------------------------------------------------------
def draw_lines(ax: Axes, summary: pd.DataFrame, x: str, hue: str, kind: Kind, styles: dict[str, tuple[Any, str]]) -> None:
    """One line per ``hue`` value of a :func:`summarise` frame, styled by its group
    (:data:`LINESTYLES`: lossy dashed, bounds dotted and hollow)."""
    for name, g in summary.groupby(hue, sort=False):
        g = g.sort_values(x)
        color, marker = styles[str(name)]
        bound = bool(g["bound"].iloc[0])
        group = "oracle" if bound else str(g["kind"].iloc[0]) if "kind" in g else "lossless"
        err = g["std"] * kind.scale if (g["count"] > 1).any() else None
        ax.errorbar(g[x], g["mean"] * kind.scale, yerr=err, color=color, marker=marker, capsize=2,
                    linestyle=LINESTYLES.get(group, "-"), label=series_label(str(name), bound, group),
                    markerfacecolor="white" if bound else color)


def series_styles(names: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """A colour and a marker per series, stable across figures of one table."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {str(n): (cmap(i % cmap.N), MARKERS[i % len(MARKERS)]) for i, n in enumerate(names)}


def legend_outside(fig: Figure, ax: Axes) -> None:
    """The legend to the right of the axes, out of the data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)


def sweep_figure(df: pd.DataFrame, params: list[str], kind_name: str, *, x: str | None = None, hue: str = "policy",
                 facet: str | None = None, baseline: str | None = None, title: str | None = None) -> Figure:
    """One figure of a sweep table (see :data:`KINDS`)."""
    import matplotlib.pyplot as plt

    if kind_name not in KINDS:
        raise PlotError(f"--kind {kind_name}: unknown; choose from {', '.join(KINDS)}")
    kind = KINDS[kind_name]
    if hue not in df.columns:
        raise PlotError(f"--hue {hue}: no such column")
    if facet is not None and facet not in df.columns:
        raise PlotError(f"--facet {facet}: not a column of this table (swept keys: {', '.join(params) or 'none'}); "
                        "sweep it to facet by it")
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise PlotError("no finished point in the table")
    xcol = _pick_x(ok, params, hue, x)
    names = list(dict.fromkeys(ok[hue].astype(str)))
    others = [c for c in params if c not in (xcol, hue, facet)]
    if kind_name == "speedup":
        base = baseline or default_baseline(names)
        ok = with_speedup(ok, hue, xcol, [c for c in (facet, *others) if c], base)
        ylabel = f"speed-up in TPOT over {base} (x)"
    else:
        ylabel = kind.label
    if kind.column not in ok.columns:
        raise PlotError(f"the table has no {kind.column} column")
    facets = list(dict.fromkeys(ok[facet])) if facet else [None]
    styles = series_styles(names)
    with print_style():
        fig, axes = plt.subplots(1, len(facets), figsize=(3.3 * len(facets), 2.4), sharey=True, squeeze=False)
        for ax, fv in zip(axes[0], facets, strict=True):
            part = ok if fv is None else ok[ok[facet] == fv]
            draw_lines(ax, summarise(part, xcol, hue, None, kind.column), xcol, hue, kind, styles)
            ax.set_xlabel(axis_label(xcol))
            if fv is not None:
                ax.set_title(f"{axis_label(str(facet))} = {fv}")
        axes[0][0].set_ylabel(ylabel)
        if kind_name == "speedup":
            for ax in axes[0]:
                ax.axhline(1.0, color="0.4", linewidth=0.6)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        legend_outside(fig, axes[0][-1])
    return fig


def ranked_bars(frame: pd.DataFrame, kind_name: str, *, label_col: str = "policy", title: str | None = None) -> Figure:
    """Horizontal bars of one metric per policy (``simctl compare``), in groups: lossless best
    first, then lossy ones (hatched, labelled ``(lossy)``), then bounds (grey, hatched), each
    group labelled and set apart."""
    import matplotlib.pyplot as plt

    kind = KINDS[kind_name]
    ok = frame[frame["status"] == "ok"]
    ok = ok.assign(kind=point_kinds(ok))
    blocks = [(g, ok[ok["kind"] == g].sort_values(kind.column, ascending=not kind.higher_is_better))
              for g in ("lossless", "lossy", "oracle")]
    blocks = [(g, b) for g, b in blocks if not b.empty]
    style = {"lossless": ("tab:blue", None), "lossy": ("tab:orange", "xx"), "oracle": ("0.75", "//")}
    heading = {"lossless": "lossless (ranked)", "lossy": "lossy (ranked apart)", "oracle": "bounds (oracles)"}
    with print_style():
        n = sum(len(b) for _, b in blocks) + len(blocks) - 1
        fig, ax = plt.subplots(figsize=(4.2, 0.22 * n + 0.9))
        ticks, labels, y = [], [], 0
        for g, block in blocks:
            color, hatch = style[g]
            ys = list(range(y, y + len(block)))
            ax.barh(ys, block[kind.column] * kind.scale, color=color, hatch=hatch, edgecolor="0.2", linewidth=0.4)
            ax.text(1.0, y - 0.45, heading[g], transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                    fontsize=6, color="0.3")
            ticks += ys
            labels += [series_label(str(nm), bool(b), g) for nm, b in zip(block[label_col], block["bound"], strict=True)]
            y += len(block) + 1
        ax.set_yticks(ticks, labels)
        ax.invert_yaxis()
        ax.set_xlabel(kind.label)
        ax.grid(axis="y", visible=False)
        if title:
            ax.set_title(title)
        fig.tight_layout()
    return fig


def save(fig: Figure, out_dir: str | Path, stem: str, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.<format>`` for each format and close it. Each file is
    written whole or not at all (:func:`moesim.sim.core.atomic.atomic_file`); a figure of the same
    name is replaced (figures are derived data, drawn again from the same table)."""
    import matplotlib.pyplot as plt

    from moesim.sim.core.atomic import atomic_file

    for fmt in formats:
        if fmt not in FORMATS and fmt not in ("svg", "eps"):
            raise PlotError(f"--format {fmt}: choose png, pdf, svg or eps")
    out = Path(out_dir)
    paths = []
    try:
        for fmt in formats:
            p = out / f"{stem}.{fmt}"
            with atomic_file(p, option="--out", force=True) as tmp:
                fig.savefig(tmp, bbox_inches="tight", format=fmt)
            paths.append(p)
    finally:
        plt.close(fig)
    return paths


def plot_sweep(table: str | Path, out_dir: str | Path, *, kinds: Sequence[str] = tuple(KINDS), x: str | None = None,
               hue: str = "policy", facet: str | None = None, baseline: str | None = None,
               formats: Sequence[str] = FORMATS) -> list[Path]:
    """Every asked figure of a sweep table, written under ``out_dir``; returns the files."""
    df, params = load_table(table)
    paths: list[Path] = []
    for k in kinds:
        fig = sweep_figure(df, params, k, x=x, hue=hue, facet=facet, baseline=baseline)
        paths += save(fig, out_dir, k.replace("-", "_"), formats)
    return paths


# --- the timeline of one run ----------------------------------------------------------------------
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
        elif track.upper().startswith("GPU"):
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
