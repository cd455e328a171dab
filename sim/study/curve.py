"""``simctl curve``: the hit rate of any policy against every cache size of a trace (or a list of
sizes), per layer and for all layers together; written as Parquet or CSV with a figure.

Every policy is simulated once per size, on the same requests, with the simulator's hit rate
(:mod:`moesim.sim.study.policy_curve`): a point of a curve is the ``hit_rate`` of ``simctl run``
on that cache. ``--one-pass`` gives LRU's and Belady's reference-by-reference curves instead
(stack distances, another definition, labelled so). Sizes are experts per layer, with the share
of a layer and the GiB of expert weights beside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:   # numpy only when a curve is computed: simctl --help stays fast
    import numpy as np


class CurveError(MoesimError, ValueError):
    """Bad input to ``simctl curve`` (an unknown phase or format)."""


def curve_table(trace: Path, policies: list[str], sizes: list[int] | None, phases: list[str],
                hardware: str, one_pass: bool = False) -> tuple[dict[str, np.ndarray], Any, list[str]]:
    """The curve table of ``policies`` at ``sizes`` (default: every size from 1 to a layer's
    experts), each simulated on the same requests (:mod:`moesim.sim.study.policy_curve`);
    with ``one_pass``, ``lru``/``belady`` come from stack distances instead (labelled
    ``one-pass`` in ``method``). Returns the columns, the trace's metadata and the setup
    defaults applied to every policy."""
    import numpy as np

    from moesim.sim.study.policy_curve import (
        STACK,
        CurveRows,
        curve_study,
        one_pass_curves,
        simulated_curves,
        size_columns,
    )
    from moesim.traces.format.trace_file import read_meta

    meta = read_meta(trace)
    E = meta.model.num_experts
    bad = [s for s in sizes or [] if not 1 <= s <= E]
    if bad:
        raise CurveError(f"--sizes: {bad[0]} is not between 1 and the {E} experts of a layer")
    wanted = sorted(set(sizes)) if sizes else list(range(1, E + 1))
    stack = [p for p in policies if p in STACK and one_pass]
    simulated = [p for p in policies if p not in stack]
    sim = (simulated_curves(curve_study(trace, simulated, wanted, phases, hardware), meta.model.num_layers)
           if simulated else CurveRows())
    parts = [sim.cols]
    if stack:
        parts.append(one_pass_curves(trace, stack, wanted, phases, sim.requests or None).cols)
    table = {k: np.asarray([v for part in parts for v in part[k]]) for k in sim.cols}
    rank = np.asarray([policies.index(str(x)) for x in table["policy"]])
    order = np.lexsort((table["size"], table["layer"], rank))
    table = {k: v[order] for k, v in table.items()}
    h, r = table["hits"].astype(np.float64), table["references"].astype(np.float64)
    table["hit_rate"] = np.divide(h, r, out=np.full(h.size, np.nan), where=r > 0)
    table.update(size_columns(table["size"], trace))
    return table, meta, sim.applied


def write_curves(cols: dict[str, np.ndarray], out: Path, fmt: str, title: str) -> list[Path]:
    """Write the table (``curve.parquet`` or ``curve.csv``), ``curve.png`` and ``curve.pdf`` into ``out``:
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
    written.append(out / "curve.pdf")
    return written


def _figure(cols: dict[str, np.ndarray], path: Path, title: str) -> Path:
    """The curve figure as ``path`` (a PNG at least 1,280 px wide) with a PDF beside it: every
    policy that ran (in its own colour and marker; ``one-pass`` curves labelled so and dashed,
    bounds dotted; past ten policies the bounds and the best eight in colour, the others grey
    and named under it, as in the sweep figures), the policies that could not run named too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from moesim.policies.contract.registry import policy_class
    from moesim.sim.study.figure_files import png_dpi
    from moesim.sim.study.figure_notes import caption
    from moesim.sim.study.plot import (
        GREY,
        KINDS,
        greyed_note,
        print_style,
        series_label,
        series_styles,
    )

    ran = cols["method"] != "n/a"
    names = list(dict.fromkeys(str(p) for p in cols["policy"][ran]))
    missing = [p for p in dict.fromkeys(str(p) for p in cols["policy"]) if p not in names]
    styles = series_styles(names)
    shown = _shown(cols, names)
    size = cols["size"]
    pct_per = float(np.nanmax(cols["cache_pct"] / np.maximum(size, 1)))
    gib_per = float(np.nanmax(cols["cache_gib"] / np.maximum(size, 1)))
    with print_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(7.2, 2.8), sharey=True)
        for name in names:
            color, marker = styles[name]
            mine = (cols["policy"] == name) & ran
            sel = mine & (cols["layer"] == -1)
            if shown is not None and name not in shown:   # behind the others, out of the legend
                left.plot(size[sel], 100 * cols["hit_rate"][sel], color=GREY, linewidth=0.8, zorder=1)
                continue
            bound = policy_class(name).oracle
            one_pass = bool(np.any(cols["method"][sel] == "one-pass"))
            line = ":" if bound else "--" if one_pass else "-"
            label = series_label(name, bound, "lossy" if policy_class(name).lossy else None)
            left.plot(size[sel], 100 * cols["hit_rate"][sel], color=color, marker=marker, linestyle=line,
                      markevery=max(1, int(sel.sum()) // 12), markerfacecolor="white" if bound else color,
                      label=label + (", one-pass" if one_pass else ""))
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
        handles, labels = left.get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)
        one_pass_drawn = bool(np.any(cols["method"] == "one-pass"))
        caption(fig, ["Hit rate as simctl run counts it (a token's experts of a layer looked up together)"
                      + ("; one-pass curves (dashed) look each expert up alone." if one_pass_drawn else "."),
                      greyed_note(names, shown, KINDS["hit-rate"]),
                      f"n/a (cannot run on this trace, see the table): {', '.join(missing)}" if missing else None],
                9.5)
        fig.savefig(path, dpi=png_dpi(fig), bbox_inches="tight")
        fig.savefig(path.with_suffix(".pdf"), bbox_inches="tight")
        plt.close(fig)
    return path


def _shown(cols: dict[str, np.ndarray], names: list[str]) -> list[str] | None:
    """The policies a curve figure draws in colour (:func:`moesim.sim.study.plot.highlight`:
    the bounds and the best by mean hit rate over the sizes), None for all of them."""
    import numpy as np
    import pandas as pd

    from moesim.policies.contract.registry import policy_class
    from moesim.sim.study.plot import KINDS, highlight

    rows = []
    for name in names:
        sel = (cols["policy"] == name) & (cols["layer"] == -1) & (cols["method"] != "n/a")
        cls = policy_class(name)
        rows.append({"policy": name, "mean": float(np.nanmean(cols["hit_rate"][sel])), "bound": bool(cls.oracle),
                     "kind": "oracle" if cls.oracle else "lossy" if cls.lossy else "lossless"})
    return highlight(pd.DataFrame(rows, columns=["policy", "mean", "bound", "kind"]), "policy", KINDS["hit-rate"])


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
    policy: Annotated[str, typer.Option("--policy", "-p", help="comma-separated policies, each simulated once per "
                                        "size on the same requests")] = "lru,belady",
    sizes: Annotated[str | None, typer.Option("--sizes", help="comma-separated cache sizes in experts per layer "
                                              "(default: every size)")] = None,
    hardware: Annotated[str, typer.Option(help="hardware of the simulated curves (hit rates of prefetching "
                                          "policies depend on timing)")] = "rtx-4090",
    one_pass: Annotated[bool, typer.Option("--one-pass", help="lru and belady from one pass of stack distances "
                                           "(each expert looked up alone: another hit-rate definition, lower than "
                                           "the simulator's; labelled one-pass) instead of simulated")] = False,
    force: Annotated[bool, typer.Option("--force", help="replace the --out folder of an earlier curve")] = False,
) -> None:
    """Hit rate against cache size for any policy, per layer and all layers: every policy
    simulated once per size on the same requests, so that each point is the hit_rate of
    simctl run on that cache (a policy that cannot run on the trace is an n/a row)."""
    import numpy as np
    from rich.console import Console
    from rich.markup import escape
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
    cols, meta, applied = curve_table(trace, pols, _ints(sizes, "--sizes"), wanted, hardware, one_pass)
    with atomic_folder(dest, option="--out", force=force, kind="curve") as tmp:   # the table and figure, or nothing
        written = [dest / p.name for p in write_curves(cols, tmp, fmt, f"{meta.model.name}: {trace.name}")]
    E = meta.model.num_experts
    all_layers = cols["layer"] == -1
    ran = all_layers & (cols["method"] != "n/a")
    refs = sorted({int(r) for r in cols["references"][ran]})
    title = f"{trace.name}: {refs[0]} references, " if len(refs) == 1 else f"{trace.name}: "
    t = Table("experts/layer", "% of layer", "GiB", *(f"{p} hit rate" for p in pols),
              title=escape(title + f"{meta.model.num_layers} layers x {E} experts"))
    shown = sorted({int(s) for s in cols["size"][all_layers]})
    if len(shown) > 8 and not sizes:
        shown = sorted({s for s in (1, meta.model.top_k, E // 8, E // 4, E // 2, 3 * E // 4, E) if s >= 1})
    for s in shown:
        row = all_layers & (cols["size"] == s)
        rates = {str(p): (r, str(m)) for p, r, m in zip(cols["policy"][row], cols["hit_rate"][row],
                                                        cols["method"][row], strict=True)}
        first = int(np.argmax(row))
        t.add_row(str(s), f"{cols['cache_pct'][first]:.1f}", f"{cols['cache_gib'][first]:.3g}",
                  *(_cell(*rates.get(p, (float("nan"), "n/a"))) for p in pols))
    console = Console()
    console.print(t)
    for note in _notes(cols, pols, applied):
        console.print(note, highlight=False, markup=False)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False, markup=False)


def _cell(rate: float, method: str) -> str:
    if method == "n/a":
        return "n/a"
    return f"{rate:.4f}" + (" (one-pass)" if method == "one-pass" else "")


def _notes(cols: dict[str, np.ndarray], pols: list[str], applied: list[str]) -> list[str]:
    """The lines under the table: what was applied to every policy, each n/a policy's reason
    (once), policies that looked up fewer references (experts run on the CPU) and what
    one-pass means."""
    import numpy as np

    notes = [f"applied to every policy: {a}" for a in applied]
    all_layers = cols["layer"] == -1
    most = int(cols["references"][all_layers].max(initial=0))
    for p in pols:
        mine = all_layers & (cols["policy"] == p)
        reasons = list(dict.fromkeys(str(n) for n in cols["note"][mine & (cols["method"] == "n/a")]))
        notes += [f"n/a: {p}: {r}" for r in reasons]
        ran = mine & (cols["method"] != "n/a")
        fewer = sorted({int(r) for r in cols["references"][ran] if r < most})
        if fewer:
            notes.append(f"{p}: {fewer[0]}" + (f" to {fewer[-1]}" if len(fewer) > 1 else "")
                         + f" of the {most} references looked up in the GPU cache (its other experts run on the CPU)")
    if np.any(cols["method"] == "one-pass"):
        notes.append("one-pass: lru and belady from stack distances, each expert looked up alone (a token's later "
                     "experts may push out its earlier ones): lower than the simulator's hit rate, which the other "
                     "curves and simctl run use")
    return notes
