"""What every importer shares: the one-line :class:`SourceError`, the model shape, column
mappings (``--map``), router-weight semantics and the atomic writer.

No importer logic lives here; :mod:`traces.import_records` (CSV, JSONL, FLAME) and
:mod:`traces.import_engines` (vLLM, SGLang, llama.cpp) build on it, and
:mod:`traces.importers` picks one by name.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.config.catalog import CatalogError, get_model, model_names
from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import ModelInfo, TraceError, TraceMeta, write_trace

# The fields of a record (CSV column or JSONL key) after mapping, and the required ones.
RECORD_FIELDS = ("request_id", "token_idx", "layer", "experts", "weights", "phase", "token_id")
REQUIRED_FIELDS = ("request_id", "token_idx", "layer", "experts")

# What the ``weights`` of an imported trace mean (recorded as ``source["weights"]``):
#   softmax      the softmax over all E router logits, at the chosen experts (rows sum to <= 1)
#   renormalized the top-k softmax renormalised over the chosen experts (rows sum to 1)
#   scores       other non-negative gate scores (e.g. sigmoid), no sum implied
WEIGHT_KINDS = ("softmax", "renormalized", "scores")
WEIGHT_SUM_TOL = 1e-2  # bf16/fp16 captures round each weight to ~3 significant digits

# The largest magnitude an integer field may hold before it is even range-checked; keeps
# int64 arithmetic safe and names the field instead of overflowing.
INT_LIMIT = 2**62


class SourceError(TraceError):
    """Malformed importer input. ``str(err)`` is one line: ``FILE, line N, field 'x': what``
    (``line`` may be another locator such as ``token 12, layer 3`` for array inputs)."""

    def __init__(
        self, path: str | os.PathLike[str] | None, message: str, *,
        line: int | None = None, field: str | None = None, where: str | None = None,
    ) -> None:
        parts = [str(path) if path is not None else "<input>"]
        if line is not None:
            parts.append(f"line {line}")
        if where is not None:
            parts.append(where)
        if field is not None:
            parts.append(f"field {field!r}")
        Exception.__init__(self, ": ".join([", ".join(parts), message]))
        self.path, self.row, self.column = path, line, field


def model_info(
    name: str, *, num_layers: int | None = None, num_experts: int | None = None,
    top_k: int | None = None, num_shared_experts: int | None = None,
) -> ModelInfo:
    """The routed-expert shape of a trace: a catalog entry, with any of the shape fields
    overridden; a name outside the catalog needs all of ``num_layers``, ``num_experts`` and
    ``top_k``. Raises :class:`sim.catalog.CatalogError` (one line) otherwise."""
    given = {"num_layers": num_layers, "num_experts": num_experts, "top_k": top_k}
    if name in model_names():
        spec = get_model(name)
        base = {"num_layers": spec.num_layers, "num_experts": spec.num_experts,
                "top_k": spec.top_k, "num_shared_experts": spec.num_shared_experts}
    elif all(v is not None for v in given.values()):
        base = {"num_shared_experts": 0}
    else:
        try:
            get_model(name)  # raises with a did-you-mean
        except CatalogError as exc:
            raise CatalogError(f"{exc}; or give --num-layers, --num-experts and --top-k") from None
        raise CatalogError(f"unknown model {name!r}")  # pragma: no cover
    for key, val in {**given, "num_shared_experts": num_shared_experts}.items():
        if val is not None:
            base[key] = int(val)
    try:
        return ModelInfo(name=name, **base)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None


def save_trace(path: str | os.PathLike[str], columns: Mapping[str, Any], meta: TraceMeta) -> Path:
    """Write an imported or generated trace (:func:`traces.format.write_trace`: validated,
    atomic, and a place that cannot be written is one line naming it)."""
    return write_trace(path, columns, meta)


def text_lines(path: Path) -> Generator[tuple[int, str], None, None]:
    """``(line number, text)`` of a UTF-8 text file, numbered from 1, each line with its end; a
    file that cannot be opened is a :class:`SourceError` naming it, and bytes that are not
    UTF-8 one naming the line they are on (each line is decoded on its own: a decoder reading
    the file in blocks would fail at the block holding them and cannot say where)."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise SourceError(path, f"cannot read ({exc.strerror})") from None
    with fh:
        for line, raw in enumerate(fh, start=1):
            try:
                yield line, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SourceError(path, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                                  line=line) from None


def decode_utf8(path: Path, data: bytes) -> str:
    """A whole file's bytes as text; bytes that are not UTF-8 are a :class:`SourceError`
    naming their line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SourceError(path, f"not UTF-8 text (byte 0x{data[exc.start]:02x})", line=line) from None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (recorded in the imported trace's ``source``)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_file(src: str | os.PathLike[str]) -> Path:
    """``src`` as a path to an existing regular file, else a one-line :class:`SourceError`."""
    p = Path(src)
    if not p.exists():
        raise SourceError(src, "no such file")
    if p.is_dir():
        raise SourceError(src, "is a directory, not a file")
    return p


def parse_request_lengths(text: str) -> list[tuple[int, int]]:
    """Parse ``"P:D,P:D,..."`` (prompt and decode tokens per request) into pairs."""
    out: list[tuple[int, int]] = []
    for i, item in enumerate(text.split(",")):
        parts = item.strip().split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            p, d = int(parts[0]), int(parts[1])
            if p < 0 or d < 0 or p + d == 0 or p + d > INT_LIMIT:
                raise ValueError
        except ValueError:
            raise MoesimError(f"--request-lengths: item {i} {item.strip()!r} is not PROMPT:DECODE "
                              "with non-negative counts, not both zero") from None
        out.append((p, d))
    return out


# --------------------------------------------------------------------------------------------
# Column mapping


def parse_column_map(text: str | Mapping[str, str] | None) -> dict[str, str]:
    """Parse ``--map FIELD=COLUMN,FIELD=COLUMN`` into ``{column in the file: record field}``.

    ``FIELD`` is one of :data:`RECORD_FIELDS` (an unknown one gets a did-you-mean); ``COLUMN``
    is the name the file uses. A field or a column named twice is an error. A mapping may also
    be given as a dict ``{field: column}``."""
    if text is None:
        return {}
    pairs: list[tuple[str, str]]
    if isinstance(text, Mapping):
        pairs = [(str(k), str(v)) for k, v in text.items()]
    else:
        pairs = []
        for item in text.split(","):
            if not item.strip():
                continue
            field, sep, column = item.partition("=")
            field, column = field.strip(), column.strip()
            if not sep or not field or not column:
                raise MoesimError(f"--map {item.strip()!r}: expected FIELD=COLUMN (e.g. experts=topk_ids)")
            pairs.append((field, column))
    out: dict[str, str] = {}
    for field, column in pairs:
        if field not in RECORD_FIELDS:
            close = difflib.get_close_matches(field, RECORD_FIELDS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(RECORD_FIELDS)}"
            raise MoesimError(f"--map {field}={column}: unknown field {field!r} ({hint})")
        if field in out.values():
            raise MoesimError(f"--map: field {field!r} is mapped twice")
        if column in out:
            raise MoesimError(f"--map: column {column!r} is mapped to both {out[column]!r} and {field!r}")
        out[column] = field
    return out


# --------------------------------------------------------------------------------------------
# Router weights


def weight_kind(
    weights: np.ndarray, declared: str, path: Path, lines: Sequence[int] | np.ndarray, *,
    field: str = "weights",
) -> str:
    """Check ``weights`` (``[rows, k]``, finite) and return what they mean, one of
    :data:`WEIGHT_KINDS`. ``declared`` is one of those or ``auto``: rows that all sum to 1
    (within :data:`WEIGHT_SUM_TOL`) are ``renormalized``, rows that all sum to at most 1 are
    ``softmax``; otherwise the user must say ``scores``. Negative weights are always an
    error, as is a declared kind the values contradict; the message names the first line."""
    if declared != "auto" and declared not in WEIGHT_KINDS:
        raise MoesimError(f"--weights {declared!r}: expected auto or one of {', '.join(WEIGHT_KINDS)}")
    lines = np.asarray(lines)

    def fail(mask: Any, msg: str) -> None:
        i = int(np.flatnonzero(mask)[0])
        raise SourceError(path, msg, line=int(lines[i]), field=field)

    neg = (weights < 0).any(axis=1)
    if neg.any():
        fail(neg, "router weights must be >= 0")
    sums = weights.sum(axis=1)
    over = sums > 1 + WEIGHT_SUM_TOL
    unit = np.abs(sums - 1) <= WEIGHT_SUM_TOL
    if declared == "auto":
        if unit.all():
            return "renormalized"
        if not over.any():
            return "softmax"
        fail(over, f"weights sum to {sums[over][0]:.4g} > 1, so they are not probabilities; "
                   "give --weights scores if they are gate scores")
    if declared == "renormalized" and not unit.all():
        fail(~unit, f"weights sum to {sums[~unit][0]:.4g}, not 1 (--weights renormalized)")
    if declared == "softmax" and over.any():
        fail(over, f"weights sum to {sums[over][0]:.4g} > 1 (--weights softmax)")
    return declared
