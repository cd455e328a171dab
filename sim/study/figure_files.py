"""Writing a figure to files: the formats asked, always a PNG at least :data:`PNG_MIN_PX`
wide and a vector file beside it, each written whole (so a figure's files never come from
different drawings, and no older drawing is left beside a new one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

FORMATS = ("png", "pdf")
"""The formats a figure is written in when none is asked."""


class PlotError(MoesimError, ValueError):
    """A table or run folder that cannot be plotted as asked; the message names the culprit."""


VECTOR_FORMATS = ("pdf", "svg", "eps")
"""The vector formats a figure may be written in; one of them is always written beside the PNG."""
PNG_MIN_PX = 1280
"""The least width in pixels of a PNG figure (read at 1,280 px without scaling up)."""


def figure_formats(asked: Sequence[str]) -> list[str]:
    """The formats a figure is written in: those asked, always with a PNG and a vector format
    (PDF unless another is asked), so that the two never come from different drawings."""
    for fmt in asked:
        if fmt != "png" and fmt not in VECTOR_FORMATS:
            raise PlotError(f"--format {fmt}: choose png, pdf, svg or eps")
    out = list(dict.fromkeys(["png", *asked]))
    if not any(f in VECTOR_FORMATS for f in out):
        out.append("pdf")
    return out


def png_dpi(fig: Figure) -> float:
    """The resolution that makes ``fig``'s PNG (cropped to its drawing) at least
    :data:`PNG_MIN_PX` wide, and no less than 200 dpi (the crop is measured at the figure's
    own resolution; text drawn at another one moves it a little, hence 10% to spare)."""
    box = fig.get_tightbbox()
    width_in = float(box.width) + 0.2 if box is not None else float(fig.get_figwidth())
    return max(200.0, 1.1 * PNG_MIN_PX / max(width_in, 1e-3))


def save(fig: Figure, out_dir: str | Path, stem: str, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.<format>`` for each format of :func:`figure_formats`,
    and again in any other figure format a file of that name already has there (an older
    drawing of this figure is never left beside the new one), then close it. Each file is
    written whole or not at all (:func:`moesim.sim.core.atomic.atomic_file`); a figure of the same
    name is replaced (figures are derived data, drawn again from the same table)."""
    import matplotlib.pyplot as plt

    from moesim.sim.core.atomic import atomic_file

    out = Path(out_dir)
    wanted = figure_formats(formats)
    wanted += [f for f in ("png", *VECTOR_FORMATS) if f not in wanted and (out / f"{stem}.{f}").is_file()]
    paths = []
    try:
        for fmt in wanted:
            p = out / f"{stem}.{fmt}"
            with atomic_file(p, option="--out", force=True) as tmp:
                fig.savefig(tmp, bbox_inches="tight", format=fmt, dpi=png_dpi(fig) if fmt == "png" else "figure")
            paths.append(p)
    finally:
        plt.close(fig)
    return paths
