"""Paper-style figures from a sweep table, and a timeline view of one run.

Sweep figures (one file per kind and format): TPOT, throughput, hit rate and host-to-device
bytes per token against a swept axis (cache rate, PCIe bandwidth...), one line per policy, and
the speed-up over a baseline policy. Each policy's group (the table's ``kind``) sets its line:
lossless solid, lossy dashed and labelled ``(lossy)``, oracle policies dotted with hollow
markers and labelled as bounds.
Swept keys other than the x axis, the line key and the facet are averaged, with the standard
deviation as error bars (several seeds). Figures are sized for a printed column, with axis
labels in units and the legend outside the data; each policy keeps its colour and marker in
every figure (:mod:`moesim.sim.study.palette`). The timeline view of one run is
:mod:`moesim.sim.study.timeline_plot`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.study.figure_files import FORMATS, PlotError, save
from moesim.sim.study.figure_notes import caption, figure_title, interval_note, missing_note

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PARAMS_META = b"moesim.params"


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
    varying = [c for c in params if c != hue and df[c].nunique() > 1 and is_numeric(df[c])]
    for c in PREFERRED_X:
        if c in varying:
            return c
    if varying:
        return varying[0]
    raise PlotError("no numeric swept key to put on the x axis; sweep one (cache.rate, hardware.pcie_gbps...) or give --x")


def is_numeric(col: pd.Series) -> bool:
    """Whether a column holds numbers (not booleans): a swept key that can be an x axis."""
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
    """Mean, standard deviation, count and the 95% interval's half-width (``ci``) of ``column``
    per (facet, hue, x), over every other swept key (seeds: :mod:`moesim.sim.study.replicates`;
    a frame whose seeds are folded already keeps its ``<column>_ci95`` and ``seeds``)."""
    from moesim.sim.study.replicates import ci95

    keys = [k for k in (facet, hue, x) if k]
    g = df.assign(kind=point_kinds(df)).groupby(keys, dropna=False, sort=False)
    out = g[column].agg(["mean", "std", "count"]).reset_index()
    out["ci"] = ci95(out["std"], out["count"])
    folded = f"{column}_ci95"
    if folded in df.columns and "seeds" in df.columns:   # a frame whose seeds are folded already
        one = (out["count"] == 1).to_numpy()
        out.loc[one, "ci"] = g[folded].first().to_numpy()[one]
        out.loc[one, "count"] = g["seeds"].first().to_numpy()[one]
    out["bound"] = g["bound"].first().to_numpy()
    out["kind"] = g["kind"].first().to_numpy()
    return out


# --- drawing --------------------------------------------------------------------------------------
GREY = "#c4c4c4"
"""The colour of the series drawn behind the highlighted ones (:func:`highlight`)."""
TOP_N = 8
"""Series drawn in colour when a figure has more than ``TOP_N + 2``; the others are grey."""
LOG_RATIO = 10.0
"""A y axis turns logarithmic when its largest series mean is this many times the median one."""


def draw_lines(ax: Axes, summary: pd.DataFrame, x: str, hue: str, kind: Kind, styles: dict[str, tuple[Any, str]],
               shown: Sequence[str] | None = None) -> None:
    """One line per ``hue`` value of a :func:`summarise` frame, styled by its group
    (:data:`LINESTYLES`: lossy dashed, bounds dotted and hollow), with its 95% interval where
    several points were averaged; a series not in ``shown`` (None: all) is a thin grey line
    behind, out of the legend."""
    for name, g in summary.groupby(hue, sort=False):
        g = g.sort_values(x)
        if shown is not None and str(name) not in shown:
            ax.plot(g[x], g["mean"] * kind.scale, color=GREY, linewidth=0.8, zorder=1, label="_grey")
            continue
        color, marker = styles[str(name)]
        bound = bool(g["bound"].iloc[0])
        group = "oracle" if bound else str(g["kind"].iloc[0]) if "kind" in g else "lossless"
        err = g["ci"] * kind.scale if (g["count"] > 1).any() else None
        ax.errorbar(g[x], g["mean"] * kind.scale, yerr=err, color=color, marker=marker, capsize=2,
                    linestyle=LINESTYLES.get(group, "-"), label=series_label(str(name), bound, group),
                    markerfacecolor="white" if bound else color, zorder=2)


def highlight(summary: pd.DataFrame, hue: str, kind: Kind, top: int = TOP_N) -> list[str] | None:
    """The series drawn in colour when a :func:`summarise` frame has more than ``top + 2``
    (None: all of them): the bounds (oracles, the reference), then the best by their mean over
    the x axis in the kind's direction, lossless ones first (``top - 2`` of them) and the best
    two lossy ones, so that no group crowds another out of the picture."""
    means = summary.groupby(hue, sort=False)["mean"].mean()
    if len(means) <= top + 2:
        return None
    first = summary.groupby(hue, sort=False)[["bound", "kind"]].first()
    group = {n: "oracle" if bool(b) else str(k) for n, b, k in zip(first.index, first["bound"], first["kind"],
                                                                       strict=True)}
    ranked = means.sort_values(ascending=not kind.higher_is_better).index
    bounds = [str(n) for n in ranked if group[n] == "oracle"]
    lossy = [str(n) for n in ranked if group[n] == "lossy"][:2]
    lossless = [str(n) for n in ranked if group[n] not in ("oracle", "lossy")][:top - len(lossy)]
    chosen = set(bounds + lossy + lossless)
    return [str(n) for n in ranked if str(n) in chosen]


def outlier_note(summary: pd.DataFrame, hue: str, kind: Kind, what: str) -> str | None:
    """Why an axis is logarithmic, or None when no series holds it hostage: the largest
    series mean is :data:`LOG_RATIO` times the median one or more (all values positive)."""
    means = summary.groupby(hue, sort=False)["mean"].mean().dropna()
    if len(means) < 3 or (summary["mean"] <= 0).any():
        return None
    med = float(means.median())
    if med <= 0 or float(means.max()) < LOG_RATIO * med:
        return None
    return (f"{what} on a log scale: {means.idxmax()} averages {float(means.max()) / med:.0f}x the median "
            "policy's, which a linear axis would flatten the others under.")


def plain_log_axis(ax: Axes, axis: str = "y") -> None:
    """A logarithmic axis with its ticks written as plain numbers (0.5, 2, 6), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    scale = ax.set_yscale if axis == "y" else ax.set_xscale
    scale("log")
    which = ax.yaxis if axis == "y" else ax.xaxis
    which.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def greyed_note(names: Sequence[str], shown: Sequence[str] | None, kind: Kind) -> str | None:
    """The caption line naming the series drawn grey."""
    if shown is None:
        return None
    rest = [n for n in names if n not in shown]
    best = "highest" if kind.higher_is_better else "lowest"
    return (f"In colour: the bounds and the {best} on average (lossless, and the best two lossy); "
            f"in grey: {', '.join(rest)}.")


def series_styles(names: Sequence[str], *, policies: bool = True) -> dict[str, tuple[Any, str]]:
    """A colour and a marker per series: a policy's own, the same in every figure of every
    command (:mod:`moesim.sim.study.palette`), or by order for other series."""
    from moesim.sim.study.palette import styles

    return dict(styles(names, policies=policies))


def pick_policies(df: pd.DataFrame, policies: Sequence[str] | None) -> pd.DataFrame:
    """The rows of the asked policies (``--policies``); a name the table lacks is one line."""
    if not policies:
        return df
    have = list(dict.fromkeys(df["policy"].astype(str)))
    unknown = [p for p in policies if p not in have]
    if unknown:
        raise PlotError(f"--policies {unknown[0]}: not in this table (it has {', '.join(have)})")
    return df[df["policy"].astype(str).isin(list(policies))]


def swept_ticks(ax: Axes, values: Sequence[Any]) -> None:
    """Ticks at the swept values of the x axis (at most twelve; more are left to matplotlib)."""
    vals = sorted({float(v) for v in values if v == v})
    if 1 < len(vals) <= 12:
        ax.set_xticks(vals, [f"{v:g}" for v in vals])
        ax.minorticks_off()


def legend_outside(fig: Figure, ax: Axes) -> None:
    """The legend to the right of the axes, out of the data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)


def sweep_figure(df: pd.DataFrame, params: list[str], kind_name: str, *, x: str | None = None, hue: str = "policy",
                 facet: str | None = None, baseline: str | None = None, title: str | None = None,
                 policies: Sequence[str] | None = None) -> Figure:
    """One figure of a sweep table (see :data:`KINDS`): ``policies`` picks the lines; the title
    names the model, hardware and trace (:func:`figure_title`) unless ``title`` is given; ticks
    sit at the swept values; a series without a finished point is named under the axes."""
    import matplotlib.pyplot as plt
    import pandas as pd

    if kind_name not in KINDS:
        raise PlotError(f"--kind {kind_name}: unknown; choose from {', '.join(KINDS)}")
    kind = KINDS[kind_name]
    if hue not in df.columns:
        raise PlotError(f"--hue {hue}: no such column")
    if facet is not None and facet not in df.columns:
        raise PlotError(f"--facet {facet}: not a column of this table (swept keys: {', '.join(params) or 'none'}); "
                        "sweep it to facet by it")
    df = pick_policies(df, policies)
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise PlotError("no finished point in the table")
    title = title if title is not None else figure_title(df)
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
    styles = series_styles(names, policies=hue == "policy")
    overall = summarise(ok, xcol, hue, None, kind.column)
    shown = highlight(overall, hue, kind)
    log_note = outlier_note(overall, hue, kind, ylabel.split(" (")[0]) if kind_name != "hit-rate" else None
    width = 3.3 * len(facets) if len(facets) > 1 else 4.6
    with print_style():
        fig, axes = plt.subplots(1, len(facets), figsize=(width, 2.6), sharey=True, squeeze=False)
        panels = []
        for ax, fv in zip(axes[0], facets, strict=True):
            part = ok if fv is None else ok[ok[facet] == fv]
            panels.append(summarise(part, xcol, hue, None, kind.column))
            draw_lines(ax, panels[-1], xcol, hue, kind, styles, shown)
            ax.set_xlabel(axis_label(xcol))
            if is_numeric(ok[xcol]):
                swept_ticks(ax, part[xcol].tolist())
            if fv is not None:
                ax.set_title(f"{axis_label(str(facet))} = {fv}")
            if log_note:
                plain_log_axis(ax)
        axes[0][0].set_ylabel(ylabel + (", log scale" if log_note else ""))
        if kind_name == "speedup":
            for ax in axes[0]:
                ax.axhline(1.0, color="0.4", linewidth=0.6)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        caption(fig, [log_note, greyed_note(names, shown, kind), interval_note(pd.concat(panels)),
                      missing_note(df, hue, names)], width + 2.0)
        legend_outside(fig, axes[0][-1])
    return fig


def ranked_bars(frame: pd.DataFrame, kind_name: str, *, label_col: str = "policy", title: str | None = None) -> Figure:
    """Horizontal bars of one metric per policy (``simctl compare``), each in its policy's colour
    (:mod:`moesim.sim.study.palette`), in groups: lossless best first, then lossy ones (hatched,
    labelled ``(lossy)``), then bounds (pale, hatched), each group labelled and set apart; the
    title names model, hardware and trace (:func:`figure_title`) unless ``title`` is given.
    Replicated seeds are folded into their mean, drawn with its 95% interval; a rank tied with
    the first of its run (:func:`~moesim.sim.study.replicates.tie_ranks`) is marked ``=``; a metric
    that one policy holds hostage is drawn on a log axis, said under it."""
    import matplotlib.pyplot as plt

    from moesim.sim.study.replicates import merge_seeds, tie_ranks

    kind = KINDS[kind_name]
    keys = [c for c in frame.columns if c == "cache.rate"]
    ok = merge_seeds(frame[frame["status"] == "ok"], keys)
    ok = ok.assign(kind=point_kinds(ok))
    ci_col = f"{kind.column}_ci95"
    blocks = [(g, ok[ok["kind"] == g].sort_values(kind.column, ascending=not kind.higher_is_better))
              for g in ("lossless", "lossy", "oracle")]
    blocks = [(g, b) for g, b in blocks if not b.empty]
    hatch_of = {"lossless": None, "lossy": "xxx", "oracle": "///"}
    colours = series_styles([str(n) for n in ok[label_col]], policies=label_col == "policy")
    heading = {"lossless": "lossless (ranked)", "lossy": "lossy (ranked apart)", "oracle": "bounds (oracles)"}
    values = ok[kind.column].astype(float)
    med = float(values.median()) if len(values) else 0.0
    log = bool(len(values) >= 3 and (values > 0).all() and med > 0 and float(values.max()) >= LOG_RATIO * med)
    with print_style():
        n = sum(len(b) for _, b in blocks) + len(blocks) - 1
        fig, ax = plt.subplots(figsize=(5.0, 0.2 * n + 1.0))
        ticks, labels, y = [], [], 0
        for g, block in blocks:
            ys = list(range(y, y + len(block)))
            ci = block[ci_col] * kind.scale if ci_col in block.columns and (block["seeds"] > 1).any() else None
            vals = block[kind.column] * kind.scale
            if log:   # a log axis has no zero for a bar to start from: a dot per policy instead
                for yy, v, nm in zip(ys, vals, block[label_col], strict=True):
                    color, marker = colours[str(nm)]
                    ax.plot([v], [yy], linestyle="none", marker=marker, markersize=5, color=color,
                            markerfacecolor="white" if g == "oracle" else color)
                if ci is not None:
                    ax.errorbar(vals, ys, xerr=ci, fmt="none", ecolor="0.3", elinewidth=0.7, capsize=1.5)
            else:
                ax.barh(ys, vals, color=[colours[str(n)][0] for n in block[label_col]],
                        hatch=hatch_of[g], edgecolor="white" if g == "lossless" else "0.15", linewidth=0.4,
                        alpha=0.55 if g == "oracle" else 0.9, xerr=ci, error_kw={"elinewidth": 0.7, "capsize": 1.5})
            ax.text(1.0, y - 0.45, heading[g], transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                    fontsize=6, color="0.3")
            ticks += ys
            ranks = tie_ranks(block[kind.column].tolist(), None if ci is None else (ci / kind.scale).tolist())
            for (nm, b), (rk, tied) in zip(zip(block[label_col], block["bound"], strict=True), ranks, strict=True):
                label = series_label(str(nm), bool(b), g)
                labels.append(label if g == "oracle" else f"{rk}{'=' if tied else ''}. {label}")
            y += len(block) + 1
        ax.set_yticks(ticks, labels)
        ax.invert_yaxis()
        ax.set_xlabel(kind.label + (", log scale" if log else ""))
        if log:
            plain_log_axis(ax, "x")
        ax.grid(axis="y", visible=False)
        title = title if title is not None else figure_title(frame)
        if title:
            ax.set_title(title)
        fig.tight_layout()
        seeds = int(ok["seeds"].max()) if "seeds" in ok.columns and len(ok) else 1
        caption(fig, [
            f"{kind.label.split(' (')[0]} on a log scale (dots, not bars: a log axis has no zero): the largest "
            f"is {float(values.max()) / med:.0f}x the median, which a linear axis would flatten the others under."
            if log else None,
            (f"Error bars: 95% interval over {seeds} seeds; " if seeds > 1 else "One seed; ")
            + "a rank marked = (2=) is shared by policies tied with the first of them "
            "(intervals overlap, or within 1%)."], 5.0)
    return fig


def plot_sweep(table: str | Path, out_dir: str | Path, *, kinds: Sequence[str] = tuple(KINDS), x: str | None = None,
               hue: str = "policy", facet: str | None = None, baseline: str | None = None,
               formats: Sequence[str] = FORMATS, policies: Sequence[str] | None = None) -> list[Path]:
    """Every asked figure of a sweep table, written under ``out_dir``; returns the files."""
    paths: list[Path] = []
    for stem, fig in sweep_figures(table, kinds=kinds, x=x, hue=hue, facet=facet, baseline=baseline,
                                   policies=policies):
        paths += save(fig, out_dir, stem, formats)
    return paths


def sweep_figures(table: str | Path, *, kinds: Sequence[str] = tuple(KINDS), x: str | None = None,
                  hue: str = "policy", facet: str | None = None, baseline: str | None = None,
                  policies: Sequence[str] | None = None) -> list[tuple[str, Figure]]:
    """Every asked figure of a sweep table with its file stem, drawn and not yet written (so
    that bad options are found before any output is touched)."""
    df, params = load_table(table)
    return [(k.replace("-", "_"), sweep_figure(df, params, k, x=x, hue=hue, facet=facet, baseline=baseline,
                                               policies=policies)) for k in kinds]
