"""``simctl curve``: LRU and Belady hit rate against every cache size of a trace, per layer and
for all layers together, in one pass each (:mod:`moesim.traces.analysis.curve`); written as Parquet or
CSV with a plot."""

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
    import numpy as np

    from moesim.sim.engine.workload import build_workload
    from moesim.traces.analysis.curve import curves
    from moesim.traces.format.trace_file import read_trace

    trace = read_trace(path, [])
    wl = build_workload(trace, batch_size=1, phases=phases, requests="all")
    rows0 = (np.concatenate([it.rows0 for it in wl.iterations]) if wl.iterations
             else np.zeros(0, dtype=np.int64))
    m = trace.model
    streams = (trace.experts[rows0 + layer].reshape(-1) for layer in range(m.num_layers))
    return curves((s[s >= 0] for s in streams), m.num_experts), trace.meta


def write_curves(cols: dict[str, np.ndarray], out: Path, fmt: str, title: str) -> list[Path]:
    """Write the table (``curve.parquet`` or ``curve.csv``) and ``curve.png`` into ``out``."""
    import pyarrow as pa

    out.mkdir(parents=True, exist_ok=True)
    table = pa.table(cols)
    written = []
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out / "curve.parquet")
        written.append(out / "curve.parquet")
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, out / "curve.csv")
        written.append(out / "curve.csv")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for pol, style in (("lru", "-o"), ("belady", "--s")):
        sel = (cols["policy"] == pol) & (cols["layer"] == -1)
        ax.plot(cols["size"][sel], cols["hit_rate"][sel], style, label=f"{pol} (all layers)", markersize=3)
    ax.set_xlabel("cache size (experts per layer)")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    plt.close(fig)
    written.append(out / "curve.png")
    return written


def curve_cmd(
    trace: Annotated[Path, typer.Argument(help="moe-trace Parquet file")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="folder for curve.parquet/.csv and curve.png (default runs/curve-<trace>)")] = None,
    phases: Annotated[str, typer.Option(help="phases replayed, comma-separated: decode, prefill")] = "decode",
    fmt: Annotated[str, typer.Option("--format", "-f", help="table format: parquet or csv")] = "parquet",
) -> None:
    """Hit rate against every cache size: LRU (stack distances) and Belady (OPT stack), per
    layer and all layers, one pass each."""
    from rich.console import Console
    from rich.table import Table

    if fmt not in ("parquet", "csv"):
        raise CurveError(f"--format: {fmt!r} is not parquet or csv")
    wanted = [p.strip() for p in phases.split(",") if p.strip()]
    bad = [p for p in wanted if p not in ("prefill", "decode")]
    if bad or not wanted:
        raise CurveError(f"--phases: {bad[0] if bad else phases!r} is not prefill or decode")
    if not trace.is_file():
        raise CurveError(f"{trace}: no such trace file")
    cur, meta = trace_curves(trace, wanted)
    cols = cur.columns()
    dest = out if out is not None else Path("runs") / f"curve-{trace.stem}"
    written = write_curves(cols, dest, fmt, f"{meta.model.name}: {trace.name}")
    E = meta.model.num_experts
    t = Table("experts/layer", "LRU hit rate", "Belady hit rate",
              title=f"{trace.name}: {int(cur.references.sum())} references, {meta.model.num_layers} layers x {E} experts")
    sizes = sorted({s for s in (1, meta.model.top_k, E // 8, E // 4, E // 2, 3 * E // 4, E) if s >= 1})
    refs = max(int(cur.references.sum()), 1)
    for s in sizes:
        t.add_row(str(s), f"{cur.lru[:, s].sum() / refs:.4f}", f"{cur.belady[:, s].sum() / refs:.4f}")
    console = Console()
    console.print(t)
    console.print("wrote " + ", ".join(str(p) for p in written))
