"""The error band beside each of ``simctl advise``'s numbers: how far moesim's predictions were
from the published rows nearest to the option (same system; the same runtime, then the same GPU
class, where there are rows), read from the committed table ``advise_bands.csv`` beside this file, which
``python benchmarks/advise_bands.py`` regenerates from the repo's published rows and predictions
(``benchmarks/results/published_systems.md`` and every ``benchmarks/results/fits/*/rows.csv``;
``tests/test_advise_bands.py`` fails when the committed table differs).

A band is the lowest and highest ``speed_ratio`` (predicted / published tokens/s) of those
rows: ``0.8-1.3x`` means moesim predicted between 0.8 and 1.3 times what was measured. Without
``--calibration`` only rows predicted at the catalogs' figures count (advise predicts at them
too); rows predicted after fitting to their own testbed are mentioned, not used. With
``--calibration FIT.yaml`` the band is that fit's own held-out error.

Each row names the runtime it was predicted with (column ``runtime``); given the runtime an
option runs, a band is made of the system's rows that ran it, when there are any (and says so),
else of all the system's rows (saying none ran it). The runtime column names a runtime's base,
not its overrides, so a row also says whether its runtime kept the KV cache in host memory
(column ``kv_on_host``, ``yes``/``no``: llama.cpp's ``-nkvo``): an option that keeps it there
(``host_kv``) is banded on the rows that did, within its runtime's, when there are some (said),
else on the rows it would have had (saying none did); the other options' bands are as before,
over rows of either kind.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("advise_bands.csv")
"""The committed table (written by ``benchmarks/advise_bands.py``)."""

COLUMNS = ["source", "set", "row", "system", "hardware", "gpu_class", "model", "metric", "published", "predicted",
           "speed_ratio", "prediction", "counted", "runtime", "kv_on_host"]
"""The table's columns, in order."""

HBM_GBPS = 1500.0
"""GPU memory bandwidth from which a GPU is in the ``hbm`` class: the data-centre parts with HBM
(A100 1.9-2.0 TB/s, H100 2-3.4, H20 4.0) against the GDDR parts (RTX 4090 1.0 TB/s, A6000 0.77,
L4 0.3): the two regimes of compute and copy time the published rows come from."""

CLASS_WORDS = {"hbm": "HBM data-centre GPUs", "gddr": "GDDR GPUs", "unknown": "GPUs of unknown class"}
"""The GPU classes in words."""


def gpu_class(hbm_gbps: float) -> str:
    """``hbm`` or ``gddr`` by the GPU's memory bandwidth (see :data:`HBM_GBPS`)."""
    return "hbm" if hbm_gbps >= HBM_GBPS else "gddr"


@dataclass(frozen=True)
class Band:
    """The spread of predicted / published speed on ``rows`` published rows (``lo`` and ``hi``
    None when there are none), and the words that say which rows."""

    lo: float | None
    hi: float | None
    rows: int
    words: str

    @property
    def known(self) -> bool:
        """Whether there are rows to make a band of."""
        return self.lo is not None and self.hi is not None

    def short(self) -> str:
        """``0.80-1.30x (9 rows)`` or ``none published``, for a table cell."""
        if not self.known:
            return "none published"
        return f"{self.lo:.2f}-{self.hi:.2f}x ({self.rows} row{'s' if self.rows != 1 else ''})"

    def interval(self, value: float, floor: float) -> tuple[float, float]:
        """The speeds a prediction of ``value`` may stand for: ``value / hi`` to ``value / lo``;
        without a band, ``floor`` either way (a single seed's resolution)."""
        if not self.known:
            return value / (1 + floor), value * (1 + floor)
        assert self.lo is not None and self.hi is not None
        return value / self.hi, value / self.lo


@cache
def load_table(path: Path = TABLE) -> tuple[dict[str, str], ...]:
    """The committed table's rows (empty when the file is missing)."""
    if not path.is_file():
        return ()
    with open(path, newline="") as f:
        return tuple(csv.DictReader(f))


def _rows(n: int) -> str:
    return f"{n} published row" + ("" if n == 1 else "s")


def _band(rows: list[dict[str, str]], words: str) -> Band:
    ratios = [float(r["speed_ratio"]) for r in rows]
    return Band(min(ratios), max(ratios), len(ratios), words)


def band_rows(system: str, cls: str, table: tuple[dict[str, str], ...] | None = None,
              runtime: str | None = None, host_kv: bool = False) -> tuple[list[dict[str, str]], bool, bool]:
    """The rows a band of ``system`` on a GPU of class ``cls`` is made of, as :func:`catalog_band`
    picks them: the counted rows, only those that ran ``runtime`` when some did, and with
    ``host_kv`` of those only the ones whose runtime kept the KV cache in host memory when some
    did; of them the ones predicted at the catalogs' figures (in class ``cls`` where there are
    some), else the fitted ones. Returns the rows, whether they are of class ``cls`` and whether
    they ran ``runtime`` (False when no runtime is given)."""
    rows = [r for r in (load_table() if table is None else table) if r["system"] == system and r["counted"] == "yes"]
    ran = [r for r in rows if runtime is not None and r.get("runtime") == runtime]
    rows = ran or rows
    if host_kv:
        rows = host_kv_rows(rows) or rows
    catalog = [r for r in rows if r["prediction"] == "catalog"]
    same = [r for r in catalog if r["gpu_class"] == cls]
    chosen = same or catalog or [r for r in rows if r["prediction"] == "fitted"]
    return chosen, bool(same), bool(ran)


def host_kv_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of ``rows`` whose runtime kept the KV cache in host memory (column ``kv_on_host``)."""
    return [r for r in rows if r.get("kv_on_host") == "yes"]


def catalog_band(system: str, label: str, cls: str, table: tuple[dict[str, str], ...] | None = None,
                 runtime: str | None = None, host_kv: bool = False) -> Band:
    """The band of ``system`` (a policy name; ``label`` its name in words) on a GPU of class
    ``cls``, from the rows predicted at the catalogs' figures: the same class where there are
    rows, else every class (said), else none (said, with the fitted rows' spread if any). Given
    ``runtime`` (the catalog runtime the option runs), only the rows that ran it, when the
    system has some (``run as RUNTIME``, said), else all of them (``none with runtime RUNTIME``,
    said); without it the words are as they always were. With ``host_kv`` (an option that keeps
    the KV cache in host memory) only the rows whose runtime did too, when there are some
    (``with the KV cache in host memory``, said), else the rows without it (``none with the KV
    cache in host memory``, said)."""
    rows, same, ran = band_rows(system, cls, table, runtime, host_kv)
    on_host = host_kv and bool(host_kv_rows(rows))
    run_as = (f" run as {runtime}" if ran else "") + (" with the KV cache in host memory" if on_host else "")
    others = f"; none with runtime {runtime}" if runtime is not None and not ran and rows else ""
    if host_kv and not on_host and rows:
        others += "; none with the KV cache in host memory"
    if rows and rows[0]["prediction"] == "catalog":
        named = _rows(len(rows)).replace(" row", f" {label} row") + run_as
        if same:
            return _band(rows, f"on {named} on {CLASS_WORDS.get(cls, cls)}{others}")
        classes = ", ".join(sorted({CLASS_WORDS.get(r['gpu_class'], r['gpu_class']) for r in rows}))
        return _band(rows, f"on {named}, none on {CLASS_WORDS.get(cls, cls)} (theirs: {classes}){others}")
    if rows:
        b = _band(rows, "")
        return Band(None, None, 0, f"no published {label} rows{run_as} at the catalog's figures ({b.rows} predicted after "
                                   f"fitting to their own testbed: {b.lo:.2f}-{b.hi:.2f}x; --calibration gives a fit's)"
                                   f"{others}")
    return Band(None, None, 0, f"no published {label} rows")


def fit_band(path: str) -> Band | None:
    """A ``simctl fit`` file's own held-out error as a band: the spread of its held-out rows'
    predicted / measured speed when its ``rows.csv`` lies beside it, else its ``max_ratio``
    either way. None for a file that is no fit or holds out no rows."""
    from moesim.sim.core.yamlio import YamlError, load_yaml_file

    p = Path(path)
    try:
        data: Any = load_yaml_file(p)
    except YamlError:
        return None
    fit = data.get("fit") if isinstance(data, dict) else None
    if not isinstance(fit, dict):
        return None
    held = fit.get("held_out")
    if not isinstance(held, dict) or not held.get("rows"):
        return None
    name = f"fit {fit.get('name', p.stem)}"
    rows_csv = p.with_name("rows.csv")
    if rows_csv.is_file():
        with open(rows_csv, newline="") as f:
            test = [r for r in csv.DictReader(f) if r.get("role") == "test" and r.get("metric") in ("tokens_per_s", "tpot_ms")
                    and not r.get("relative_to")]
        ratios = [float(r["predicted"]) / float(r["measured"]) if r["metric"] == "tokens_per_s"
                  else float(r["measured"]) / float(r["predicted"]) for r in test]
        if ratios:
            return Band(min(ratios), max(ratios), len(ratios), f"on the {len(ratios)} held-out speed rows of {name}")
    mx = float(held.get("max_ratio", float("nan")))
    return Band(1 / mx, mx, int(held["rows"]), f"within {mx:.2f}x either way on the {held['rows']} held-out rows of {name}")


__all__ = ["Band", "CLASS_WORDS", "COLUMNS", "HBM_GBPS", "TABLE", "band_rows", "catalog_band", "fit_band", "gpu_class",
           "host_kv_rows", "load_table"]
