"""What a ``simctl report`` shows, before it is rendered: the figures and the report itself,
shared by the builder (:mod:`moesim.sim.study.report`) and the HTML page
(:mod:`moesim.sim.study.report_html`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FIGURE_DPI = 160
"""The least resolution figures are drawn at (:func:`moesim.sim.study.report.figures`; more
where their PNG would be under 1,280 px wide)."""


@dataclass
class Figure:
    """One figure of a report: its file stem, caption, PNG bytes and the resolution they were
    drawn at (so that the page shows the figure at its printed size)."""

    stem: str
    caption: str
    png: bytes
    dpi: float = FIGURE_DPI


@dataclass
class Report:
    """Everything a report shows, before it is rendered."""

    title: str
    subtitle: str | None
    provenance: list[tuple[str, str]]
    commands: list[dict[str, Any]]
    figures: list[Figure]
    tables: list[tuple[str, list[str], list[list[str]]]]
    notes: list[str]
    footnotes: list[str] = field(default_factory=list)
    md_notes: list[str] = field(default_factory=list)
    """``notes`` with each warning and default escaped for Markdown (``notes`` are raw text,
    escaped by the HTML page)."""
