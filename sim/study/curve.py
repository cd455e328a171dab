"""``simctl curve``: the hit rate of any policy against every cache size of a trace (or a list of
sizes), per layer and for all layers together; written as Parquet or CSV with a figure.

LRU and Belady come from one pass each (stack distances, :mod:`moesim.traces.analysis.curve`);
any other policy is simulated once per size on the fast path where it has one
(:mod:`moesim.sim.study.policy_curve`). Sizes are experts per layer, with the share of a layer
and the GiB of expert weights beside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:   # numpy only when a curve is computed: simctl --help stays fast
    import numpy as np


class CurveError(MoesimError, ValueError):
    """Bad input to ``simctl curve`` (an unknown phase or format)."""


def trace_curves(path: Path, phases: list[str]) -> tuple[Any, Any]:
    """The curves of the trace at ``path`` over its requests' tokens of ``phases`` (batch 1,
    trace order); returns ``(Curves, TraceMeta)``. Reads only the routing."""

    from moesim.sim.engine.workload import build_workload
    from moesim.traces.analysis.curve import curves
    from moesim.traces.format.trace_file import read_trace

    trace = read_trace(path, [])
    wl = build_workload(trace, batch_size=1, phases=phases, requests="all")
    rows0 = wl.token_rows()
    m = trace.model
    streams = (trace.experts[rows0 + layer].reshape(-1) for layer in range(m.num_layers))
    return curves((s[s >= 0] for s in streams), m.num_experts), trace.meta


def curve_table(trace: Path, policies: list[str], sizes: list[int] | None, phases: list[str],
                hardware: str, simulate: bool = False) -> tuple[dict[str, np.ndarray], Any, list[str]]:
    """The curve table of ``policies`` (``lru``/``belady`` from stack distances unless
    ``simulate``, the others simulated) at ``sizes`` (default: every size from 1 to a layer's
    experts); returns the columns (``method`` says which way each row was measured), the
    trace's metadata and the setup defaults applied to simulated policies."""
    import numpy as np

    from moesim.sim.study.policy_curve import STACK, simulated_curve, size_columns
    from moesim.traces.format.trace_file import read_meta

    meta = read_meta(trace)
    E = meta.model.num_experts
    bad = [s for s in sizes or [] if not 1 <= s <= E]
    if bad:
        raise CurveError(f"--sizes: {bad[0]} is not between 1 and the {E} experts of a layer")
    wanted = sorted(set(sizes)) if sizes else list(range(1, E + 1))
    parts: list[dict[str, np.ndarray]] = []
    notes: list[str] = []
    stack = [p for p in policies if p in STACK and not simulate]
    if stack:
        cur, meta = trace_curves(trace, phases)
        cols = cur.columns()
        keep = np.isin(cols["policy"], stack) & np.isin(cols["size"], wanted)
        part = {k: v[keep] for k, v in cols.items() if k != "hit_rate"}
        parts.append({**part, "method": np.full(int(keep.sum()), "stack")})
    for p in policies:
        if p not in stack:
            sim_cols, applied = simulated_curve(trace, p, wanted, phases, hardware)
            notes += [f"{p}: {a}" for a in applied]
            sim = {k: np.asarray(v) for k, v in sim_cols.items()}
            parts.append({**sim, "method": np.full(sim["size"].size, "simulated")})
    table = {k: np.concatenate([part[k] for part in parts])
             for k in ("policy", "layer", "size", "hits", "references", "method")}
    rank = np.asarray([policies.index(str(x)) for x in table["policy"]])
    order = np.lexsort((table["size"], table["layer"], rank))
    table = {k: v[order] for k, v in table.items()}
    h, r = table["hits"].astype(np.float64), table["references"].astype(np.float64)
    table["hit_rate"] = np.divide(h, r, out=np.full(h.size, np.nan), where=r > 0)
    table.update(size_columns(table["size"], trace))
    return table, meta, notes


def write_curves(cols: dict[str, np.ndarray], out: Path, fmt: str, title: str) -> list[Path]:
    """Write the table (``curve.parquet`` or ``curve.csv``) and ``curve.png`` into ``out``:
    all layers per policy on the left (experts per layer below, share of a layer above), each
    layer's curve on the right (GiB of expert weights above), policies in their own colours."""
    import pyarrow as pa

    out.mkdir(parents=True, exist_ok=True)
    table = pa.table({k: (v.astype(str) if k in ("policy", "method") else v) for k, v in cols.items()})
    written = []
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out / "curve.parquet")
        written.append(out / "curve.parquet")
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, out / "curve.csv")
        written.append(out / "curve.csv")
    written.append(_figure(cols, out / "curve.png", title))
    return written


def _figure(cols: dict[str, np.ndarray], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from moesim.policies.contract.registry import policy_class
    from moesim.sim.study.plot import print_style, series_styles

    names = list(dict.fromkeys(str(p) for p in cols["policy"]))
    styles = series_styles(names)
    size = cols["size"]
    pct_per = float(np.nanmax(cols["cache_pct"] / np.maximum(size, 1)))
    gib_per = float(np.nanmax(cols["cache_gib"] / np.maximum(size, 1)))
    with print_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(7.2, 2.8), sharey=True)
        for name in names:
            color, marker = styles[name]
            mine = cols["policy"] == name
            sel = mine & (cols["layer"] == -1)
            bound = policy_class(name).oracle
            line = ":" if bound else "-"
            left.plot(size[sel], 100 * cols["hit_rate"][sel], color=color, marker=marker, linestyle=line,
                      markevery=max(1, int(sel.sum()) // 12), markerfacecolor="white" if bound else color,
                      label=f"{name} (bound)" if bound else name)
            for lay in sorted(set(cols["layer"][mine].tolist()) - {-1}):
                s = mine & (cols["layer"] == lay)
                right.plot(size[s], 100 * cols["hit_rate"][s], color=color, linestyle=line, linewidth=0.6, alpha=0.55)
        for ax, what in ((left, "all layers"), (right, "each layer")):
            ax.set_xlabel("cache size (experts per layer)")
            ax.set_ylim(0, 100)
            ax.set_title(what)
        left.set_ylabel("expert hit rate (%)")
        left.secondary_xaxis("top", functions=(lambda x: x * pct_per, lambda p: p / pct_per)).set_xlabel(
            "% of a layer's experts")
        right.secondary_xaxis("top", functions=(lambda x: x * gib_per, lambda g: g / gib_per)).set_xlabel(
            "GiB of expert weights (all layers)")
        fig.suptitle(title)
        fig.tight_layout()
        left.legend(loc="lower right", frameon=False)
        fig.savefig(path, dpi=160, bbox_inches="tight")
        plt.close(fig)
    return path


def _ints(text: str | None, option: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CurveError(f"{option}: expected whole numbers separated by commas, got {text!r}") from None


def curve_cmd(
    trace: Annotated[Path, typer.Argument(help="moe-trace Parquet file")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="folder for curve.parquet/.csv and curve.png (default runs/curve-<trace>)")] = None,
    phases: Annotated[str, typer.Option(help="phases replayed, comma-separated: decode, prefill")] = "decode",
    fmt: Annotated[str, typer.Option("--format", "-f", help="table format: parquet or csv")] = "parquet",
    policy: Annotated[str, typer.Option("--policy", "-p", help="comma-separated policies: lru and belady in one pass, "
                                        "any other simulated once per size")] = "lru,belady",
    sizes: Annotated[str | None, typer.Option("--sizes", help="comma-separated cache sizes in experts per layer "
                                              "(default: every size)")] = None,
    hardware: Annotated[str, typer.Option(help="hardware of the simulated curves (hit rates of prefetching "
                                          "policies depend on timing)")] = "rtx-4090",
    simulate: Annotated[bool, typer.Option("--simulate", help="simulate lru and belady too (the simulator's replay, "
                                           "where a token's experts are resident together) instead of one pass")] = False,
    force: Annotated[bool, typer.Option("--force", help="replace the --out folder of an earlier curve")] = False,
) -> None:
    """Hit rate against cache size for any policy, per layer and all layers: LRU (stack
    distances) and Belady (OPT stack) in one pass each, the others simulated per size."""
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from moesim.policies.contract.registry import policy_names
    from moesim.sim.core.atomic import atomic_folder, check_target

    if fmt not in ("parquet", "csv"):
        raise CurveError(f"--format: {fmt!r} is not parquet or csv")
    wanted = [p.strip() for p in phases.split(",") if p.strip()]
    bad = [p for p in wanted if p not in ("prefill", "decode")]
    if bad or not wanted:
        raise CurveError(f"--phases: {bad[0] if bad else phases!r} is not prefill or decode")
    pols = list(dict.fromkeys(p.strip() for p in policy.split(",") if p.strip()))
    known = policy_names()
    unknown = [p for p in pols if p not in known]
    if unknown or not pols:
        import difflib

        close = difflib.get_close_matches(unknown[0], known, n=1) if unknown else []
        raise CurveError(f"--policy: {unknown[0] if unknown else policy!r} is not a registered policy"
                         + (f"; did you mean {close[0]!r}?" if close else "; see simctl policies"))
    if not trace.is_file():
        raise CurveError(f"{trace}: no such trace file")
    dest = out if out is not None else Path("runs") / f"curve-{trace.stem}"
    check_target(dest, option="--out", folder=True, force=force)
    cols, meta, applied = curve_table(trace, pols, _ints(sizes, "--sizes"), wanted, hardware, simulate)
    with atomic_folder(dest, option="--out", force=force, kind="curve") as tmp:   # the table and figure, or nothing
        written = [dest / p.name for p in write_curves(cols, tmp, fmt, f"{meta.model.name}: {trace.name}")]
    E = meta.model.num_experts
    refs = int(cols["references"][(cols["layer"] == -1)].max(initial=0))
    t = Table("experts/layer", "% of layer", "GiB", *(f"{p} hit rate" for p in pols),
              title=f"{trace.name}: {refs} references, {meta.model.num_layers} layers x {E} experts")
    all_layers = cols["layer"] == -1
    shown = sorted({int(s) for s in cols["size"][all_layers]})
    if len(shown) > 8 and not sizes:
        shown = sorted({s for s in (1, meta.model.top_k, E // 8, E // 4, E // 2, 3 * E // 4, E) if s >= 1})
    for s in shown:
        row = all_layers & (cols["size"] == s)
        rates = {str(p): r for p, r in zip(cols["policy"][row], cols["hit_rate"][row], strict=True)}
        first = int(np.argmax(row))
        t.add_row(str(s), f"{cols['cache_pct'][first]:.1f}", f"{cols['cache_gib'][first]:.3g}",
                  *(f"{rates.get(p, float('nan')):.4f}" for p in pols))
    console = Console()
    console.print(t)
    for note in applied:
        console.print(f"applied: {note}", highlight=False, markup=False)
    methods = set(cols["method"].tolist())
    if len(methods) > 1:
        console.print("lru and belady are one-pass sequential curves; the others replay on the simulator, where "
                      "a token's experts must be resident together (give --simulate to run all of them there)",
                      highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in written))
