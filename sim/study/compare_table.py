"""The tables of ``simctl compare``: Markdown in groups, and CSV with raw numbers.

``compare.md`` has one table per group (:data:`~moesim.sim.study.compare.GROUPS`): lossless
policies ranked; lossy ones ranked apart, with what their speed cost in routing (mass kept,
top-1 kept, substitutions and drops per token, effective top-k); oracles as bounds; then the
points that did not run (``n/a``, with the reason) and the failed ones, one row per policy and
reason with the swept values (cache rates...) it holds at. Every row that warned
carries its warnings beside it (``notes`` refers to the list under the tables); a warning every
run shares, and the setup defaults applied to every run, are said once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moesim.sim.core.escape import csv_safe, md_text
from moesim.sim.study.compare import GROUPS, NOT_APPLICABLE
from moesim.sim.study.plot import series_label

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.study.compare import Comparison

TITLES = {
    "lossless": "Lossless policies (every routed expert runs): ranked by {metric}",
    "lossy": ("Lossy policies (they run other experts than the router chose): ranked apart by {metric}, "
              "with what the speed cost in routing"),
    "oracle": "Bounds: oracle policies (they read the future; not ranked)",
}
"""The heading of each group's table."""
SPEED = [("TPOT ms", "tpot_ms_mean", ".2f", 1.0), ("TPOT p99 ms", "tpot_ms_p99", ".2f", 1.0),
         ("TTFT ms", "ttft_ms_mean", ".2f", 1.0), ("tokens/s", "tokens_per_s", ".1f", 1.0),
         ("hit %", "hit_rate", ".1f", 100.0), ("late %", "late_rate", ".1f", 100.0),
         ("miss %", "miss_rate", ".1f", 100.0), ("stall ms/token", "stall_ms_per_token", ".2f", 1.0),
         ("H2D MB/token", "h2d_gb_per_token", ".1f", 1e3)]
"""The speed columns of every group: (header, metric, format, scale)."""
LOSS = [("mass kept %", "routing_mass_kept", ".1f", 100.0), ("top-1 kept %", "top1_agreement", ".1f", 100.0),
        ("subst./token", "substitutions_per_token", ".2f", 1.0), ("dropped/token", "dropped_per_token", ".2f", 1.0),
        ("eff. top-k", "effective_top_k", ".2f", 1.0)]
"""What a lossy policy's speed cost in routing, beside its speed (same layout as :data:`SPEED`)."""
METRIC_NAMES = {"tpot": "TPOT (mean)", "ttft": "TTFT (mean)", "throughput": "tokens/s", "hit-rate": "hit rate",
                "bytes": "host-to-device bytes per token"}
"""How ``--metric`` reads in the headings."""
RAW = ["tpot_ms_mean", "tpot_ms_p99", "ttft_ms_mean", "tokens_per_s", "hit_rate", "late_rate", "miss_rate",
       "stall_ms_per_token", "h2d_gb_per_token", "routing_mass_kept", "top1_agreement", "substitutions_per_token",
       "dropped_per_token", "effective_top_k", "speedup"]
"""The metric columns of ``compare.csv``, as raw numbers."""


def _num(v: Any, fmt: str, scale: float = 1.0) -> str:
    if v is None or v != v:  # None or NaN
        return "-"
    return format(float(v) * scale, fmt)


BY_HEADERS = {"cache.rate": "cache rate", "cache.experts_per_layer": "experts/layer", "cache.gib": "cache GiB",
              "hardware.pcie_gbps": "PCIe GB/s", "hardware.pcie_latency_us": "PCIe latency µs",
              "workload.batch_size": "batch size"}
"""The header of a column ranked within (:attr:`Comparison.by`), where it differs from the key."""


def _cell(v: Any) -> str:
    """A swept value in a table: numbers as ``%g``, anything else as text."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _num(v, "g")
    return "-" if v is None else str(v)


def _list(value: Any) -> list[str]:
    """A JSON list cell (``warnings``, ``applied``) as a list of strings."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if value is None or not isinstance(value, str):   # None, NaN or pandas' NA: nothing
        return []
    try:
        items = json.loads(str(value))
    except ValueError:
        return [str(value)]
    return [str(v) for v in items] if isinstance(items, list) else [str(items)]


class Notes:
    """The warnings and applied defaults of a comparison's runs: those every run shares, said
    once, and a short reference (``w1``, ``a1``) per row for the others."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        ran = [r for r in records if r.get("status") == "ok"]
        warn = [_list(r.get("warnings")) for r in ran]
        appl = [_list(r.get("applied")) for r in ran]
        self.common_warnings = [w for w in warn[0] if all(w in ws for ws in warn)] if warn else []
        self.common_applied = [a for a in appl[0] if all(a in xs for xs in appl)] if appl else []
        self.refs: dict[str, str] = {}

    def row(self, rec: dict[str, Any]) -> str:
        """The ``notes`` cell of one run: references to its own warnings and defaults."""
        own = [("w", w) for w in _list(rec.get("warnings")) if w not in self.common_warnings]
        own += [("a", a) for a in _list(rec.get("applied")) if a not in self.common_applied]
        cells = []
        for prefix, text in own:
            if text not in self.refs:
                n = sum(1 for r in self.refs.values() if r.startswith(prefix)) + 1
                self.refs[text] = f"{prefix}{n}"
            cells.append(self.refs[text])
        return ", ".join(cells)

    def lines(self, text: Callable[[str], str] = str) -> list[str]:
        """The notes under the tables, each warning and default passed through ``text`` (the
        escaping of where they go: :func:`~moesim.sim.core.escape.md_text` for Markdown)."""
        out = []
        if self.common_applied:
            out.append("Setup defaults applied to every run: " + "; ".join(map(text, self.common_applied)) + ".")
        if self.common_warnings:
            out.append("Every run warns: " + " / ".join(map(text, self.common_warnings)) + ".")
        applied = [(ref, t) for t, ref in self.refs.items() if ref.startswith("a")]
        warned = [(ref, t) for t, ref in self.refs.items() if ref.startswith("w")]
        if applied:
            out += ["", "Setup defaults applied (notes column):"] + [f"- {ref}: {text(t)}" for ref, t in applied]
        if warned:
            out += ["", "Warnings (notes column): a run that warns did not run as its paper meant it in full."]
            out += [f"- {ref}: {text(t)}" for ref, t in warned]
        return out


def group_tables(comp: Comparison) -> tuple[list[tuple[str, list[str], list[list[str]]]], Notes]:
    """Each group's (title, header, rows) in table order, and the notes they refer to."""
    records = comp.frame.to_dict("records")
    notes = Notes(records)
    rate = [BY_HEADERS.get(k, k) for k in comp.by]

    def rate_cell(r: dict[str, Any]) -> list[str]:
        return [_cell(r.get(k)) for k in comp.by]

    tables = []
    speedup = f"speed-up vs {comp.baseline}"
    metric_col = _metric_column(comp.metric)
    seeds = int(comp.frame["seeds"].max()) if "seeds" in comp.frame.columns and len(comp.frame) else 1
    ci_head = f"± 95% ({seeds} seeds)"
    for kind in GROUPS:
        rows_in = [r for r in records if r["status"] == "ok" and r["kind"] == kind]
        if not rows_in:
            continue
        cols = SPEED if kind != "lossy" else [c for c in SPEED if c[1] not in ("ttft_ms_mean", "late_rate")] + LOSS
        ci_at = next((i for i, c in enumerate(cols) if c[1] == metric_col), None) if seeds > 1 else None
        heads = [c[0] for c in cols]
        if ci_at is not None:
            heads.insert(ci_at + 1, ci_head)
        head = [*rate, "rank", "policy", *heads, speedup, "notes"]
        rows = []
        for r in rows_in:
            rk = "bound" if kind == "oracle" else str(int(r["rank"])) + ("=" if r.get("tied") is True else "")
            label = series_label(str(r["policy"]), kind == "oracle")
            cells = [_num(r.get(c[1]), c[2], c[3]) for c in cols]
            if ci_at is not None:
                c = cols[ci_at]
                cells.insert(ci_at + 1, _num(r.get(f"{c[1]}_ci95"), c[2], c[3]))
            rows.append([*rate_cell(r), rk, label, *cells, _num(r.get("speedup"), ".2f"), notes.row(r)])
        tables.append((TITLES[kind].format(metric=METRIC_NAMES.get(comp.metric, comp.metric)), head, rows))
    for status, title in ((NOT_APPLICABLE, "Not run (n/a): the policy cannot run as its paper meant it here"),
                          ("error", "Failed")):
        # one row per policy and reason, listing the swept values it holds at (not one per value)
        held: dict[tuple[str, str, str], list[str]] = {}
        for r in records:
            if r["status"] == status if status == NOT_APPLICABLE else r["status"] not in ("ok", NOT_APPLICABLE):
                key = (str(r["policy"]), str(r["kind"]), " ".join(str(r.get("error")).split()))
                where = " / ".join(rate_cell(r))
                held.setdefault(key, [])
                if where not in held[key]:
                    held[key].append(where)
        rows = [[*([", ".join(at)] if rate else []), p, k, why] for (p, k, why), at in held.items()]
        if rows:
            head = [" / ".join(rate)] if rate else []
            tables.append((title, [*head, "policy", "kind", "reason" if status == NOT_APPLICABLE else "error"], rows))
    return tables, notes


def _metric_column(metric: str) -> str:
    from moesim.sim.study.compare import _column

    return _column(metric)[0]


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub Markdown table's lines: text columns set left, numbers right; every header and
    cell is plain text (:func:`~moesim.sim.core.escape.md_text`: no raw HTML, no broken row)."""
    left = {"policy", "kind", "rank", "notes", "reason", "error"}
    lines = ["| " + " | ".join(map(md_text, head)) + " |",
             "| " + " | ".join("---" if h in left else "---:" for h in head) + " |"]
    lines += ["| " + " | ".join(map(md_text, row)) + " |" for row in rows]
    return lines


def to_markdown(comp: Comparison) -> str:
    """The comparison as GitHub Markdown: a table per group, then the notes."""
    tables, notes = group_tables(comp)
    lines: list[str] = []
    for title, head, rows in tables:
        lines += [f"### {title}", "", *markdown_table(head, rows), ""]
    lossy = comp.frame[(comp.frame["status"] == "ok") & (comp.frame["kind"] == "lossy")]
    if not lossy.empty:
        slots = "routing_mass_weighted" in lossy and not lossy["routing_mass_weighted"].fillna(True).astype(bool).all()
        lines.append("Lossy policies: later routing is replayed as recorded, so the output's quality is not "
                     "simulated; mass kept is the share of the router's probability that still runs"
                     + (" (counted in slots where the trace has no router weights)" if slots else "")
                     + "; `simctl quality` measures the effect on a real model.")
    scope = (" within each cache rate" if comp.by == ["cache.rate"]
             else f" within each {', '.join(comp.by)}" if comp.by else "")
    seeds = int(comp.frame["seeds"].max()) if "seeds" in comp.frame.columns and len(comp.frame) else 1
    spread = (f"means of {seeds} seeds with the half-width of their 95% interval; a rank marked = is shared "
              "by policies tied with the first of them (intervals overlap, or within 1%)" if seeds > 1 else
              "one seed: a rank marked = is shared by policies within 1% of the first of them (below what one run "
              "tells apart; give --seeds N for intervals)")
    lines.append(f"Ranked by {METRIC_NAMES.get(comp.metric, comp.metric)}{scope}, lossless and lossy apart; "
                 f"speed-up is {md_text(comp.baseline)}'s TPOT over each row's; {md_text(spread)}.")
    extra = notes.lines(md_text)
    if extra:
        lines += ["", *extra]
    return "\n".join(lines) + "\n"


def to_csv(comp: Comparison) -> str:
    """The comparison as CSV with raw numbers (rates as fractions, times in ms), one row per
    point: its group (``kind``), rank and whether it is tied, status, seeds, warnings and
    applied defaults (`` | ``-joined); with several seeds, each metric's ``_ci95`` too; a text
    cell a spreadsheet would run as a formula is guarded (:func:`~moesim.sim.core.escape.csv_cell`)."""
    frame = comp.frame
    cols = [c for c in [*comp.by, "kind", "rank", "tied", "policy", "bound", "status", "seeds", *RAW,
                        *(f"{m}_ci95" for m in RAW)] if c in frame.columns]
    out = frame[cols].copy()
    for name in ("warnings", "applied"):
        out[name] = [" | ".join(_list(v)) for v in frame[name]] if name in frame.columns else ""
    for name in ("error", "config_hash"):
        if name in frame.columns:
            out[name] = frame[name]
    return str(csv_safe(out).to_csv(index=False))
