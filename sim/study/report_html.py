"""The HTML page of ``simctl report``: one self-contained file.

Figures are inline PNG (``data:`` URIs) and the style sheet is inline, so the page needs no
network and no other file. Each ranking is a ``<table class="ranking">`` under its group's
heading; a row's notes (``w1``, ``a2``: its own warnings and applied setup defaults) are badges
whose tooltip holds the full text, which is also listed under the tables.
"""

from __future__ import annotations

import base64
import re
from html import escape

from moesim.sim.study.report_model import Report

STYLE = """
:root { --ink: #1d2330; --muted: #5b6474; --line: #dde1e8; --band: #f5f7fa; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 32px 64px; }
h1 { font-size: 24px; margin: 0 0 2px; }
.subtitle { color: var(--muted); font-size: 15px; margin: 0 0 22px; }
h2 { font-size: 18px; margin: 34px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 24px 0 8px; color: var(--accent); }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 9px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--band); font-weight: 600; text-align: left; white-space: nowrap; }
table.ranking { width: 100%; font-size: 12.5px; }
table.ranking th { white-space: normal; vertical-align: bottom; min-width: 3.2em; }
table.ranking th, table.ranking td { padding: 3px 6px; }
table.ranking td.num, table.ranking th.num { text-align: right; }
table.ranking tbody tr:nth-child(even) { background: #fafbfc; }
table.ranking tbody tr:hover { background: #eef4fb; }
table.ranking tr.group-start td { border-top: 2px solid #b9c1cd; }
table.ranking td { white-space: nowrap; }
table.ranking td.wrap { white-space: normal; min-width: 280px; }
table.ranking td.notes { white-space: normal; }
table.ranking td.name { font-weight: 500; }
table.prov th { width: 190px; background: none; color: var(--muted); font-weight: 500; }
table.prov td { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; word-break: break-all; }
.scroll { overflow-x: auto; }
pre { background: #0f1722; color: #e6edf3; padding: 10px 14px; border-radius: 6px; white-space: pre-wrap;
      word-break: break-word; font-size: 12.5px; }
.when { color: var(--muted); font-size: 12.5px; margin: 8px 0 2px; }
.figures { display: flex; flex-wrap: wrap; gap: 18px; }
figure { margin: 0; padding: 10px; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
figure img { display: block; max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 12.5px; margin-top: 6px; }
.badge { display: inline-block; padding: 0 6px; margin: 0 2px 0 0; border-radius: 9px; font-size: 11.5px;
         background: #fff3cd; color: #6b4e00; border: 1px solid #f0d98a; cursor: help; }
.badge.a { background: #e7f1ff; color: #1f4f8f; border-color: #b8d3f5; }
.notes p, .notes li { color: #333a46; font-size: 13px; }
.empty { color: var(--muted); }
"""
LEFT = {"policy", "kind", "rank", "notes", "reason", "error"}
"""Columns set left; every other column holds numbers and is set right."""


SCREEN_DPI = 140
"""The CSS pixels per inch a figure is shown at: print-sized figures (8 pt labels, 6.5 pt
captions) read at 12-15 px, about the page's own text, and a figure of 7 inches with its
legend takes most of the page's width (wider ones shrink to it)."""


def _png_width(png: bytes) -> int:
    """The pixel width in a PNG's header (0 when it is not a PNG)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        return 0
    return int.from_bytes(png[16:20], "big")


def _note_texts(lines: list[str]) -> dict[str, str]:
    """``{"w1": text}`` from the notes' ``- w1: text`` lines."""
    out = {}
    for line in lines:
        m = re.match(r"- ([wa]\d+): (.*)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _badges(cell: str, texts: dict[str, str]) -> str:
    refs = [r.strip() for r in cell.split(",") if r.strip()]
    return "".join(f'<span class="badge {escape(r[0])}" title="{escape(texts.get(r, r))}">{escape(r)}</span>'
                   for r in refs)


def _table(head: list[str], rows: list[list[str]], texts: dict[str, str]) -> str:
    cls = ["" if h in LEFT else ' class="num"' for h in head]
    out = ['<div class="scroll"><table class="ranking"><thead><tr>']
    out += [f"<th{c}>{escape(h)}</th>" for h, c in zip(head, cls, strict=True)]
    out.append("</tr></thead><tbody>")
    grouped = bool(head) and head[0] not in LEFT   # rows come in runs of one cache rate (or swept value)
    previous = None
    for row in rows:
        start = grouped and previous is not None and row[0] != previous
        previous = row[0] if row else None
        cells = []
        for h, c, v in zip(head, cls, row, strict=True):
            if h == "policy":
                c = ' class="name"'
            elif h in ("reason", "error"):
                c = ' class="wrap"'
            elif h == "notes":
                c = ' class="notes"'
            cells.append(f"<td{c}>{_badges(v, texts) if h == 'notes' else escape(v)}</td>")
        out.append(('<tr class="group-start">' if start else "<tr>") + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _prose(lines: list[str]) -> str:
    """Note lines (paragraphs and ``- `` items) as HTML, code spans kept."""
    html: list[str] = []
    items: list[str] = []

    def inline(text: str) -> str:
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))

    def flush() -> None:
        if items:
            html.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in lines:
        if line.startswith("- "):
            items.append(line[2:])
            continue
        flush()
        if line.strip():
            html.append(f"<p>{inline(line)}</p>")
    flush()
    return "".join(html)


def to_html(rep: Report) -> str:
    """The report as one self-contained HTML page."""
    texts = _note_texts(rep.notes)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(rep.title)}</title><style>{STYLE}</style></head><body><main>",
             f"<h1>{escape(rep.title)}</h1>"]
    if rep.subtitle:
        parts.append(f'<p class="subtitle">{escape(rep.subtitle)}</p>')
    parts.append('<h2>Provenance</h2><table class="prov"><tbody>')
    parts += [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rep.provenance]
    parts.append("</tbody></table><h2>Command</h2>")
    if rep.commands:
        for c in rep.commands:
            parts.append(f'<p class="when">{escape(str(c.get("at", "")))} in <code>{escape(str(c.get("cwd", "")))}</code>'
                         f' (moesim {escape(str(c.get("moesim_version", "?")))})</p>')
            parts.append(f"<pre>{escape(str(c.get('command', '')))}</pre>")
    else:
        parts.append('<p class="empty">Not recorded: the folder was made before moesim recorded its commands '
                     "(study.json).</p>")
    if rep.figures:
        parts.append('<h2>Figures</h2><div class="figures">')
        for f in rep.figures:
            data = base64.b64encode(f.png).decode("ascii")
            width = f' width="{round(_png_width(f.png) * SCREEN_DPI / f.dpi)}"' if _png_width(f.png) else ""
            parts.append(f'<figure><img alt="{escape(f.caption)}"{width} src="data:image/png;base64,{data}">'
                         f"<figcaption>{escape(f.caption)}</figcaption></figure>")
        parts.append("</div>")
    parts.append("<h2>Rankings</h2>")
    if not rep.tables:
        parts.append('<p class="empty">No point in the table.</p>')
    for title, head, rows in rep.tables:
        parts.append(f"<h3>{escape(title)}</h3>{_table(head, rows, texts)}")
    parts.append(f'<div class="notes">{_prose(rep.footnotes)}{_prose(rep.notes)}</div>')
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"
