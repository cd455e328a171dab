"""Importers that turn router logs of other tools into moe-trace v1 files.

Each importer returns ``(columns, meta)`` ready for :func:`traces.format.write_trace`;
:func:`import_trace` picks one by name and writes the file atomically. The formats (each
documented in README.md, "Importing router logs"):

``flame``
    The FLAME-MoE-290M routing sample (``routing.csv``): :mod:`traces.import_records`.
``csv`` / ``jsonl``
    One record per (request, token, layer); a column map renames other tools' columns;
    incomplete tokens may be dropped; the meaning of the weights is recorded as
    ``source["weights"]``: :mod:`traces.import_records`.
``vllm`` / ``sglang`` / ``llamacpp``
    The routed-experts captures of those engines: :mod:`traces.import_engines`.

Every malformed input raises :class:`SourceError` (or, for a bad option, a
:class:`sim.errors.MoesimError`) whose one-line message names the file, the line (or array
index) and the field. This module re-exports the public names of the three modules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import ModelInfo, TraceMeta
from moesim.traces.importers.common import (
    RECORD_FIELDS,
    WEIGHT_KINDS,
    SourceError,
    model_info,
    parse_column_map,
    parse_request_lengths,
    save_trace,
)
from moesim.traces.importers.engines import (
    import_llamacpp,
    import_sglang,
    import_vllm,
    read_sidecar,
)
from moesim.traces.importers.records import (
    FLAME_MODEL,
    FLAME_SOURCE,
    import_csv,
    import_flame,
    import_jsonl,
)

FORMATS = ("flame", "csv", "jsonl", "vllm", "sglang", "llamacpp")

__all__ = [
    "FLAME_MODEL", "FLAME_SOURCE", "FORMATS", "RECORD_FIELDS", "WEIGHT_KINDS", "SourceError",
    "import_csv", "import_flame", "import_jsonl", "import_llamacpp", "import_sglang", "import_trace",
    "import_vllm", "model_info", "parse_column_map", "parse_request_lengths", "read_sidecar", "save_trace",
]


def import_trace(
    fmt: str, src: str | os.PathLike[str], out: str | os.PathLike[str], *,
    model: ModelInfo | None = None,
    sidecar: str | os.PathLike[str] | None = None,
    request_lengths: Sequence[tuple[int, int]] | None = None,
    column_map: str | Mapping[str, str] | None = None,
    drop_incomplete: bool = False,
    weights: str = "auto",
) -> tuple[Path, TraceMeta, int]:
    """Import ``src`` in format ``fmt`` (one of :data:`FORMATS`) and write ``out`` atomically
    (nothing is written when the input is bad). Returns ``(out, meta, rows)``. ``model`` is
    required except for ``flame``; ``column_map`` (``"field=column,..."`` or a dict
    ``{field: column}``), ``drop_incomplete`` and ``weights`` apply to ``csv``/``jsonl``;
    ``sidecar`` to ``vllm`` ``.npy`` captures; ``request_lengths`` to those and ``llamacpp``."""
    if fmt not in FORMATS:
        raise MoesimError(f"unknown import format {fmt!r} (expected one of {', '.join(FORMATS)})")
    rename = parse_column_map(column_map)
    if fmt not in ("csv", "jsonl") and (rename or drop_incomplete or weights != "auto"):
        raise MoesimError(f"--map, --drop-incomplete and --weights apply to --from csv and jsonl, not {fmt}")
    if sidecar is not None and fmt != "vllm":
        raise MoesimError("--sidecar applies to --from vllm only")
    if request_lengths is not None and fmt not in ("vllm", "llamacpp"):
        raise MoesimError("--request-lengths applies to --from vllm and llamacpp only")
    if weights != "auto" and weights not in WEIGHT_KINDS:
        raise MoesimError(f"--weights {weights!r}: expected auto or one of {', '.join(WEIGHT_KINDS)}")
    if fmt == "flame":
        cols, meta = import_flame(src, model=model)
    else:
        if model is None:
            raise MoesimError(f"--model is required for --from {fmt}")
        if fmt == "csv":
            cols, meta = import_csv(src, model=model, column_map=rename, drop_incomplete=drop_incomplete,
                                    weights=weights)
        elif fmt == "jsonl":
            cols, meta = import_jsonl(src, model=model, column_map=rename, drop_incomplete=drop_incomplete,
                                      weights=weights)
        elif fmt == "vllm":
            cols, meta = import_vllm(src, model=model, sidecar=sidecar, request_lengths=request_lengths)
        elif fmt == "sglang":
            cols, meta = import_sglang(src, model=model)
        else:
            cols, meta = import_llamacpp(src, model=model, request_lengths=request_lengths)
    path = save_trace(out, cols, meta)
    return path, meta, int(len(cols["request_id"]))
