"""What moesim may replace: its own outputs, never the user's files.

Every output folder moesim creates carries a marker file, :data:`MARKER` (``.moesim-output``,
a line of JSON: what wrote it, which command kind, and for a study its key). ``--force``
replaces a folder only when it carries the marker or is empty, and a file only when moesim
wrote it: a file inside a folder carrying the marker (at any depth), a Parquet file whose
metadata moesim put there (a moe-trace, a study's table), or a text file that starts with
moesim's header comment (``# moesim ...``: calibration profiles, fits). Some places are never
written into or replaced, whatever the options: ``/``, the home folder and its ancestors, the
working folder and its ancestors (:func:`protected_reason`). A folder that holds moesim's
layout from before the marker existed is refused with a line saying how to proceed
(:func:`legacy_kind`): moesim cannot tell it from a folder the user has since filled.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

MARKER = ".moesim-output"
"""The marker file in every output folder moesim creates."""

HEADER = b"# moesim"
"""How the text files moesim writes begin (a YAML comment)."""

PARQUET_KEYS = (b"moe_trace", b"moesim.params")
"""Parquet schema metadata keys that only moesim writes: a moe-trace, a study's table."""

LEGACY_LAYOUTS: dict[str, tuple[str, ...]] = {
    "run": ("config.yaml", "metrics.json"),
    "study": ("points", "study.json"),
    "study table": ("points", "results.parquet"),
    "fit": ("fitted.yaml", "rows.csv"),
    "validation": ("validation.json",),
    "advice": ("advise.csv",),
    "curve": ("curve.png",),
    "model": ("model.safetensors", "train_log.json"),
}
"""The files (all present) that made each kind of moesim output folder before the marker."""


def write_marker(folder: Path, kind: str, **extra: Any) -> None:
    """Put the marker into ``folder`` (a folder moesim has just created): ``kind`` is the
    command's output kind (``run``, ``sweep``, ``fit``...), ``extra`` what else identifies it
    (a study's ``study`` key)."""
    data = {"written_by": "moesim", "kind": kind, **extra}
    (folder / MARKER).write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder`` as a mapping, or None when it has none (a marker moesim cannot
    read still marks the folder: an empty mapping)."""
    path = Path(folder) / MARKER
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _resolved(path: Path) -> Path:
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return Path(os.path.abspath(path))


def protected_reason(path: Path) -> str | None:
    """Why moesim never writes into nor replaces ``path`` (``the root folder``, ``your home
    folder``, ``the working folder``, ``an ancestor of the working folder``...), or None."""
    p = _resolved(Path(path))
    if p == Path(p.anchor):
        return "the root folder"
    places = []
    with contextlib.suppress(OSError, RuntimeError, KeyError):   # no home folder known
        places.append((_resolved(Path.home()), "your home folder"))
    with contextlib.suppress(OSError):                             # the working folder was deleted
        places.append((_resolved(Path.cwd()), "the working folder"))
    for place, name in places:
        if p == place:
            return name
    for place, name in places:
        if p in place.parents:
            return f"an ancestor of {name}"
    return None


def is_empty_folder(path: Path) -> bool:
    """True for a folder with nothing in it."""
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:
        return False


def owned_folder(path: Path) -> bool:
    """True when ``--force`` may replace the folder ``path``: it carries the marker or is empty."""
    return not path.is_symlink() and path.is_dir() and (read_marker(path) is not None or is_empty_folder(path))


def legacy_kind(path: Path) -> str | None:
    """The kind of moesim output the unmarked folder ``path`` looks like (from before the
    marker), or None."""
    for kind, names in LEGACY_LAYOUTS.items():
        if all((path / n).exists() for n in names):
            return kind
    return None


def inside_owned_folder(path: Path) -> bool:
    """True when a folder above ``path`` carries the marker (the file is part of an output)."""
    return any(read_marker(parent) is not None for parent in _resolved(Path(path)).parents)


def _moesim_parquet(path: Path) -> bool:
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:   # not Parquet, unreadable: not recognised
        return False
    return any(k in meta for k in PARQUET_KEYS)


def owned_file(path: Path) -> bool:
    """True when moesim wrote the file ``path`` (see the module's rule): it lies in a marked
    folder, or its content is of a kind only moesim writes."""
    p = Path(path)
    if p.is_symlink() or not p.is_file():
        return False
    if inside_owned_folder(p):
        return True
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(HEADER))
    except OSError:
        return False
    if head == HEADER:
        return True
    return head[:4] == b"PAR1" and _moesim_parquet(p)
