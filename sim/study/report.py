"""``simctl report DIR``: one page per study, a sweep's or a comparison's folder.

The report gathers what a reader needs to trust a ranking at a glance:

- the provenance of every finished point: model, hardware, runtime and where its numbers come
  from (its calibration source), the trace's name and sha256 (the join keys every run records,
  :data:`moesim.sim.run.runner.JOIN_KEYS`), the workload (batch size, phases, requests asked
  for and replayed, the profile split), the seeds, moesim's version and source revision (git
  describe of the checkout that ran it), and the points run, failed and n/a;
- the command lines that made the folder (``study.json``,
  :mod:`moesim.sim.study.study_record`);
- the figures: TPOT, hit rate and speed-up against the swept axis (one panel per value of a
  second swept key), or ranked bars where nothing numeric was swept;
- the ranked tables in groups (:mod:`moesim.sim.study.compare_table`): lossless, lossy apart,
  bounds, n/a with the reason and failed points, each row with its warnings and applied
  defaults beside it.

It is written twice: ``report.html``, self-contained (figures inline as base64 PNG, the style
inline: it opens anywhere, offline, and can be mailed), and ``report.md`` with the figures as PNG
files in ``report-figures/`` beside it (:mod:`moesim.sim.study.report_html` renders the HTML).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.escape import md_code, md_text
from moesim.sim.study.figure_files import PlotError
from moesim.sim.study.replicates import SEED
from moesim.sim.study.report_model import FIGURE_DPI, Figure, Report

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from moesim.sim.study.compare import Comparison

HTML, MARKDOWN, FIGURES = "report.html", "report.md", "report-figures"
MAX_BAR_CHARTS = 6
"""Ranked-bar charts a report draws at most (one per value of a non-numeric swept key)."""




def _is_policy_key(key: str) -> bool:
    return key in ("policy", "policy_spec") or key.startswith("policy.")


def _values(df: pd.DataFrame, col: str) -> str:
    if col not in df.columns:
        return "not recorded (the table predates it)"
    vals = [str(v) for v in dict.fromkeys(df[col].dropna()) if str(v) != ""]
    return " / ".join(vals) if vals else "-"


def provenance(df: pd.DataFrame, study: dict[str, Any]) -> list[tuple[str, str]]:
    """The (label, value) rows of the provenance table, from the finished points' join keys."""
    ok = df[df["status"] == "ok"]
    rows = [("study", f"{study.get('name') or '-'} ({study.get('source') or 'source not recorded'})")]
    rows += [("model", _values(ok, "model_name")), ("hardware", _values(ok, "hardware_name")),
             ("runtime", _values(ok, "runtime_name")), ("runtime numbers from", _values(ok, "runtime_source")),
             ("trace", _values(ok, "trace_name")), ("trace sha256", _values(ok, "trace_sha256"))]
    if "cache_rate" in ok.columns:
        rates = sorted({round(float(v), 6) for v in ok["cache_rate"].dropna()})
        rows.append(("expert cache", ", ".join(f"{r:.4g}" for r in rates) + " of the routed experts' bytes"))
    rows.append(("workload", _workload(ok, study)))
    seeds = study.get("seeds")
    if isinstance(seeds, list) and seeds:
        rows.append(("seed", ", ".join(str(x) for x in seeds) + (f" ({len(seeds)} seeds: means with 95% intervals)"
                                                              if len(seeds) > 1 else "")))
    else:
        rows.append(("seed", "not recorded (the folder predates it)"))
    rows.append(("moesim", _values(df, "moesim_version")))
    revisions = [str(c.get("revision")) for c in study.get("commands", []) if isinstance(c, dict) and c.get("revision")]
    rows.append(("source revision", " / ".join(dict.fromkeys(revisions)) if revisions
                 else "not recorded (the folder predates it)"))
    n_a = int((df["status"] == "n/a").sum())
    failed = int((~df["status"].isin(["ok", "n/a"])).sum())
    rows.append(("points", f"{len(df)}: {len(ok)} ok, {failed} failed, {n_a} n/a"))
    return rows


def _workload(ok: pd.DataFrame, study: dict[str, Any]) -> str:
    """``batch 1, phases prefill + decode, requests all (4 replayed), profile split 8``: each
    workload the study recorded, with the requests the finished points replayed."""
    replayed = sorted({int(v) for v in ok["requests"].dropna()}) if "requests" in ok.columns else []
    done = f" ({' / '.join(str(r) for r in replayed)} replayed)" if replayed else ""
    parts = []
    for w in study.get("workloads") or []:
        if not isinstance(w, dict):
            continue
        req = w.get("requests")
        asked = "all" if req == "all" else f"the first {req}" if isinstance(req, int) else f"ids {req}"
        prof = w.get("profile") or {}
        split = (f", profile split: the first {prof['requests']} requests" if isinstance(prof, dict)
                 and prof.get("requests") else "")
        parts.append(f"batch {w.get('batch_size')}, phases {' + '.join(w.get('phases') or [])}, "
                     f"requests {asked}{done}{split}")
    return "; ".join(parts) if parts else "not recorded (the folder predates it)" + done


def _figure(stem: str, caption: str, fig: Any) -> Figure:
    """A report figure: ``fig`` as a PNG at least 1,280 px wide, then closed."""
    import matplotlib.pyplot as plt

    from moesim.sim.study.figure_files import png_dpi

    buf = io.BytesIO()
    dpi = max(FIGURE_DPI, png_dpi(fig))
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Figure(stem, caption, buf.getvalue(), dpi)


def figures(df: pd.DataFrame, params: list[str], comp: Comparison) -> list[Figure]:
    """The report's figures: TPOT, hit rate and speed-up against the first numeric swept key
    (faceted by a second one), or ranked bars of the metric where nothing numeric varies."""
    from moesim.sim.study.plot import KINDS, is_numeric, ranked_bars, sweep_figure

    ok = df[df["status"] == "ok"]
    if ok.empty:
        return []
    # replicated seeds are averaged (95% intervals), never an axis or a panel
    others = [c for c in params if not _is_policy_key(c) and c != SEED and c in ok.columns and ok[c].nunique() > 1]
    numeric = [c for c in others if is_numeric(ok[c])]
    out = []
    if not numeric:   # ranked bars: one chart per value of a swept key (a policy appears once per chart)
        kind = comp.metric if comp.metric in KINDS else "tpot"
        if not others:
            out.append(_figure("ranked", f"{KINDS[kind].label}, ranked in groups", ranked_bars(df, kind)))
        for i, value in enumerate(list(dict.fromkeys(ok[others[0]]))[:MAX_BAR_CHARTS] if others else []):
            part = df[df[others[0]] == value]
            caption = f"{KINDS[kind].label}, ranked in groups, {others[0]} = {value}"
            out.append(_figure(f"ranked_{i + 1}", caption, ranked_bars(part, kind)))
        return out
    x = numeric[0]
    facet = next((c for c in others if c != x), None)
    for kind, caption in (("tpot", "Mean time per output token"), ("hit-rate", "Expert hit rate"),
                          ("speedup", f"Speed-up in TPOT over {comp.baseline}")):
        try:
            fig = sweep_figure(df, params, kind, x=x, facet=facet, baseline=comp.baseline)
        except PlotError:
            continue
        out.append(_figure(kind.replace("-", "_"), caption, fig))
    return out


def build_report(folder: str | Path, *, metric: str = "tpot", baseline: str | None = None) -> Report:
    """Read a sweep's or comparison's folder and gather its :class:`Report`."""
    from moesim.sim.study.compare import rank
    from moesim.sim.study.compare_table import group_tables
    from moesim.sim.study.figure_notes import figure_title
    from moesim.sim.study.plot import load_table
    from moesim.sim.study.study_record import read_study

    path = Path(folder)
    if not path.is_dir():
        raise PlotError(f"{folder}: no such folder (give a sweep's or comparison's output folder)")
    df, params = load_table(path)
    study = read_study(path)
    by = [c for c in params if not _is_policy_key(c)]
    comp = rank(df, metric=metric, baseline=baseline, by=by)
    tables, notes = group_tables(comp)
    from moesim.sim.study.compare_table import to_markdown

    md_lines = to_markdown(comp).splitlines()
    tail = md_lines[next((i for i, ln in enumerate(md_lines) if ln and not ln.startswith(("#", "|"))),
                         len(md_lines)):]
    said = set(notes.lines())
    footnotes = [ln for ln in tail if ln.strip() and ln not in said]
    name = str(study.get("name") or path.resolve().name)
    return Report(title=f"moesim report: {name}", subtitle=figure_title(df), provenance=provenance(df, study),
                  commands=[c for c in study.get("commands", []) if isinstance(c, dict)],
                  figures=figures(df, params, comp), tables=tables, notes=notes.lines(), footnotes=footnotes,
                  md_notes=notes.lines(md_text))


def to_markdown(rep: Report, figure_dir: str = FIGURES) -> str:
    """The report as Markdown; figures are referenced as ``figure_dir/<stem>.png``. Every text
    from the study's files (names, paths, warnings, commands) is plain text there
    (:mod:`moesim.sim.core.escape`): no raw HTML, no broken table."""
    lines = [f"# {md_text(rep.title)}", ""]
    if rep.subtitle:
        lines += [f"*{md_text(rep.subtitle)}*", ""]
    lines += ["## Provenance", "", "| | |", "| --- | --- |"]
    lines += [f"| {md_text(k)} | {md_text(v)} |" for k, v in rep.provenance]
    lines += ["", "## Command", ""]
    if rep.commands:
        for c in rep.commands:
            lines += [f"Run {md_text(c.get('at', ''))} in {md_code(c.get('cwd', ''))}:", "",
                      md_code(c.get("command", ""), block=True), ""]
    else:
        lines += ["Not recorded: the folder was made before moesim recorded its commands (study.json).", ""]
    if rep.figures:
        lines += ["## Figures", ""]
        for f in rep.figures:
            lines += [f"![{md_text(f.caption)}]({figure_dir}/{f.stem}.png)", "", f"*{md_text(f.caption)}*", ""]
    lines += ["## Rankings", ""]
    for title, head, rows in rep.tables:
        lines += [f"### {md_text(title)}", "", "| " + " | ".join(map(md_text, head)) + " |",
                  "| " + " | ".join("---" for _ in head) + " |"]
        lines += ["| " + " | ".join(map(md_text, row)) + " |" for row in rows]
        lines.append("")
    lines += rep.footnotes   # the comparison's Markdown lines, escaped where they were made
    if rep.md_notes:
        lines += ["", *rep.md_notes]
    return "\n".join(lines).rstrip() + "\n"


def write_report(folder: str | Path, out: str | Path | None = None, *, metric: str = "tpot",
                 baseline: str | None = None) -> list[Path]:
    """Write ``report.html``, ``report.md`` and its figures into ``out`` (default: the study's
    folder), each file whole or not at all; returns the files written. ``out`` is new, empty, or
    a folder moesim wrote (:func:`moesim.sim.core.atomic.own_folder`)."""
    from moesim.sim.core.atomic import atomic_file, own_folder
    from moesim.sim.study.report_html import to_html

    rep = build_report(folder, metric=metric, baseline=baseline)
    dest = own_folder(Path(out) if out is not None else Path(folder), option="--out", kind="report")
    if rep.figures:
        own_folder(dest / FIGURES, option="--out", kind="report-figures")
    written = []
    for f in rep.figures:
        target = dest / FIGURES / f"{f.stem}.png"
        with atomic_file(target, option="--out", force=True) as tmp:
            tmp.write_bytes(f.png)
        written.append(target)
    for name, text in ((MARKDOWN, to_markdown(rep)), (HTML, to_html(rep))):
        with atomic_file(dest / name, option="--out", force=True) as tmp:
            tmp.write_text(text, encoding="utf-8")
        written.append(dest / name)
    return written
