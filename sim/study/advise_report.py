"""What ``simctl advise`` prints and writes: the options table, the best option, the Pareto
front of VRAM against tokens/s (``advise.png`` / ``advise.svg``), ``advise.csv`` and
``advise.md``."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from moesim.sim.study.advise import Advice, AdviseRequest, Row

COLUMNS = ["system", "setting", "bits", "vram_gib", "host_gib", "tokens_per_s", "pareto", "best", "status", "error",
           "tie", "band_low", "band_high", "band_rows", "band", "unmerged"]


def row_values(r: Row) -> dict[str, Any]:
    """One row as plain values (the CSV's columns)."""
    o = r.option
    return {"system": o.system, "setting": o.setting, "bits": round(o.shape.bits, 3),
            "vram_gib": round(o.vram_gib, 2), "host_gib": round(o.host_gib, 2),
            "tokens_per_s": None if r.tokens_per_s is None else round(r.tokens_per_s, 4),
            "pareto": r.pareto, "best": r.best, "status": r.status, "error": r.error or "", "tie": r.tie,
            "band_low": None if r.band is None or r.band.lo is None else round(r.band.lo, 4),
            "band_high": None if r.band is None or r.band.hi is None else round(r.band.hi, 4),
            "band_rows": 0 if r.band is None else r.band.rows, "band": "" if r.band is None else r.band.words,
            "unmerged": o.unmerged}


def _ordered(advice: Advice) -> list[Row]:
    return sorted(advice.rows, key=lambda r: (r.option.shape.bits, -(r.tokens_per_s or -1.0)))


def _speed(r: Row) -> str:
    """``12.30 tokens/s (0.80-1.30x on 9 published llama.cpp rows on GDDR GPUs)``."""
    band = r.band
    if band is None:
        return f"{r.tokens_per_s:.2f} tokens/s"
    if not band.known:
        return f"{r.tokens_per_s:.2f} tokens/s ({band.words})"
    return f"{r.tokens_per_s:.2f} tokens/s ({band.lo:.2f}-{band.hi:.2f}x {band.words})"


def _cells(r: Row) -> list[str]:
    """One option as the table and ``advise.md`` show it: system, setting, bits, VRAM and host GiB
    (rounded once, as the headline rounds them), tokens/s (or why none), band, mark."""
    o = r.option
    tps = f"{r.tokens_per_s:.2f}" if r.tokens_per_s is not None else r.status
    return [o.system, _setting(r), f"{round(o.shape.bits, 3):g}", f"{o.vram_gib:.1f}", f"{o.host_gib:.1f}", tps,
            r.band.short() if r.band else "", r.mark()]


def _setting(r: Row) -> str:
    return r.option.setting + (" [unmerged]" if r.option.unmerged else "")


def headline(req: AdviseRequest, advice: Advice) -> list[str]:
    """The best option of each weight width with its error band, one line each, and the options
    tied with it (within the error bands)."""
    lines = []
    for r in advice.best():
        o = r.option
        ties = [t for t in advice.ok() if t.tie and not t.best and t.option.shape.bits == o.shape.bits]
        what = f"fastest at {o.shape.bits:g} bits, tied with {len(ties)} within the error bands" if ties \
            else f"best at {o.shape.bits:g} bits"
        lines.append(f"{what}: {o.system}, {_setting(r)}: {_speed(r)}; {o.vram_gib:.1f} of {req.vram_gib:g} GiB "
                     f"VRAM, {o.host_gib:.1f} of {req.host_gib:g} GiB host")
        seen: set[str] = set()
        for t in ties:
            if t.option.system not in seen:   # the fastest tie of each system
                seen.add(t.option.system)
                lines.append(f"  tie: {t.option.system}, {_setting(t)}: {_speed(t)}")
    return lines


def print_report(req: AdviseRequest, advice: Advice, console: Any, *, limit: int | None = None) -> None:
    """The table (fastest first, per weight width), the best, the calibration and the workload."""
    from rich.markup import escape
    from rich.table import Table

    rows = _ordered(advice)
    t = Table("system", "setting (as the tool spells it)", "bits", "VRAM GiB", "host GiB", "tokens/s", "error band", "",
              title=escape(f"{advice.model_name} on {Path(req.gpu).name}, {req.vram_gib:g} GiB VRAM, "
                           f"{req.host_gib:g} GiB host"))
    shown = rows if limit is None else rows[:limit]
    for r in shown:
        t.add_row(*(escape(c) for c in _cells(r)))
    console.print(t)
    if limit is not None and len(rows) > limit:
        console.print(f"... {len(rows) - limit} more options (--all lists them, --out writes them all)")
    for line in headline(req, advice):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    failed = [r for r in advice.rows if r.tokens_per_s is None]
    for r in failed[:5]:
        console.print(f"not simulated: {r.option.system}, {r.option.setting}: {r.status} {r.error or ''}",
                      highlight=False, markup=False)
    for line in advice.caveats:
        console.print(f"caveat: {line}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"workload: {advice.workload}", highlight=False, markup=False)
    for note in advice.notes:
        console.print(f"memory: {note}", highlight=False, markup=False, soft_wrap=True)
    console.print("calibration:", highlight=False)
    for line in advice.calibration:
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"{len(advice.rows)} options: {advice.points_run} simulated, {advice.points_reused} reused",
                  highlight=False)


def csv_text(advice: Advice) -> str:
    """Every option as CSV."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in _ordered(advice):
        w.writerow(row_values(r))
    return buf.getvalue()


def markdown(req: AdviseRequest, advice: Advice) -> str:
    """The report as Markdown: the best, the table, the workload and the calibration."""
    out = [f"# simctl advise: {advice.model_name} on {Path(req.gpu).name}", "",
           f"{req.vram_gib:g} GiB VRAM, {req.host_gib:g} GiB host memory.", ""]
    out += [f"- {line}" for line in headline(req, advice)] + [""]
    out += [f"- caveat: {c}" for c in advice.caveats] + [""]
    out += ["| system | setting (as the tool spells it) | bits | VRAM GiB | host GiB | tokens/s | error band | |",
            "|---|---|---|---|---|---|---|---|"]
    for r in _ordered(advice):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    out += ["", f"Workload: {advice.workload}.", ""] + [f"Memory: {n}." for n in advice.notes] + ["", "Calibration:", ""]
    out += [f"- {line.strip()}" for line in advice.calibration]
    return "\n".join(out) + "\n"


def figure(req: AdviseRequest, advice: Advice) -> Any:
    """VRAM used against tokens/s: every option by system, the Pareto front as a step line,
    the best circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    widths = list(dict.fromkeys(r.option.shape.bits for r in advice.rows))
    markers = "osD^v<>"
    for system in dict.fromkeys(r.option.system for r in advice.rows):
        for i, bits in enumerate(widths):
            pts = [r for r in advice.ok() if r.option.system == system and r.option.shape.bits == bits]
            if pts:
                label = system if len(widths) == 1 else f"{system}, {bits:g} bits"
                ax.scatter([r.option.vram_gib for r in pts], [float(r.tokens_per_s or 0.0) for r in pts], label=label,
                           marker=markers[i % len(markers)], s=28, alpha=0.85)
    for bits in widths:
        front = sorted((r for r in advice.ok() if r.pareto and r.option.shape.bits == bits),
                       key=lambda r: r.option.vram_gib)
        if front:
            ax.step([r.option.vram_gib for r in front], [float(r.tokens_per_s or 0.0) for r in front], where="post",
                    color="black", lw=1, alpha=0.6)
    for r in advice.best():
        ax.scatter([r.option.vram_gib], [float(r.tokens_per_s or 0.0)], s=180, facecolors="none", edgecolors="red", lw=1.5)
        ax.annotate(f"{'fastest (ties)' if r.tie else 'best'}: {r.option.system}\n{r.option.setting}", (r.option.vram_gib, r.tokens_per_s or 0),
                    textcoords="offset points", xytext=(-14, -44), ha="right", fontsize=8,
                    bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8})
    ax.axvline(req.vram_gib, color="grey", ls=":", lw=1)
    ax.set_xlabel("VRAM used (GiB, reserve included)")
    ax.set_ylabel("predicted tokens/s (decode, batch 1)")
    ax.set_title(f"{advice.model_name} on {Path(req.gpu).name}: VRAM against speed (black: Pareto front)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def write_outputs(req: AdviseRequest, advice: Advice, out: Path) -> list[Path]:
    """``advise.csv``, ``advise.md``, ``advise.png`` and ``advise.svg`` in ``out``, each written whole."""
    from moesim.sim.core.atomic import atomic_file

    written = []
    for name, text in (("advise.csv", csv_text(advice)), ("advise.md", markdown(req, advice))):
        with atomic_file(out / name, option="--out", force=True) as tmp:
            tmp.write_text(text)
        written.append(out / name)
    fig = figure(req, advice)
    import matplotlib.pyplot as plt

    try:
        for ext in ("png", "svg"):
            with atomic_file(out / f"advise.{ext}", option="--out", force=True) as tmp:
                fig.savefig(tmp, dpi=130 if ext == "png" else None, format=ext)
            written.append(out / f"advise.{ext}")
    finally:
        plt.close(fig)
    return written
