"""The moe-trace v1 file format: its contract (this docstring), writer and streaming reader.

The schema and the file metadata are in :mod:`traces.schema`, the row-by-row validation in
:mod:`traces.validation`; this module re-exports the schema's names, so ``from
moesim.traces.format.trace_file import ...`` reaches the whole format.

One row per (request, token, MoE layer), sorted by ``(request_id, token_idx, layer)``; every
(request, token) holds all layers ``0..L-1``. The file-level metadata lives under the Parquet
key-value key ``moe_trace`` as JSON (the contract is this docstring). Inside a request
``token_idx`` counts 0, 1, 2, ... and request ids do not skip (3 follows 2); columns hold
integers (ids), strings (``phase``, or a dictionary of strings) or lists of one depth
(``experts`` of integers; ``weights``, logits and ``embedding`` of floats); router weights
are >= 0; any other column is an error. A file breaking any of this is refused with one
line naming the file, row and column.

Reading streams record batches, so a trace far larger than memory can be validated and
replayed batch by batch; :func:`read_trace` materialises only the columns asked for, as
compact numpy arrays (``experts`` as an ``[rows, top_k]`` int16 matrix, logits as
``[rows, E]`` float16).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moesim.sim.core.atomic import atomic_file
from moesim.traces.format.arrow_numpy import to_numpy
from moesim.traces.format.column_types import EXPECTED_KIND, kind_problem
from moesim.traces.format.schema import (
    ALL_COLUMNS,
    DEFAULT_BATCH_ROWS,
    META_KEY,
    OPTIONAL_COLUMNS,
    PHASES,
    REQUIRED_COLUMNS,
    SCHEMA,
    ModelInfo,
    TraceError,
    TraceMeta,
)
from moesim.traces.format.validation import Cursor, check_complete, first_bad_row, validate_batch

# isort: split
# Re-exports: ``from moesim.traces.format.trace_file import ...`` keeps reaching the schema's names (PREFILL,
# DECODE, TraceMeta, ModelInfo, TraceError, PHASES, ... : many callers) as before the schema moved
# to traces/format/schema.py; the ones imported above for use here are re-exported as they are.
from moesim.traces.format.schema import DECODE as DECODE
from moesim.traces.format.schema import PREFILL as PREFILL

# --------------------------------------------------------------------------------------------
# Reading


def check_schema(schema: pa.Schema, path: Any) -> None:
    """Every column of the file must be a moe-trace v1 column of the right kind of Arrow type
    (integers, floats, strings, lists of one depth); raise :class:`TraceError` naming the first
    that is not. Cheap: the schema only."""
    for f in schema:
        if f.name not in EXPECTED_KIND:
            raise TraceError(path, f"unknown column (moe-trace v1 has {', '.join(ALL_COLUMNS)})", column=f.name)
        problem = kind_problem(f.name, f.type)
        if problem:
            raise TraceError(path, problem, column=f.name)


_CORRUPT = (pa.ArrowException, OSError, UnicodeDecodeError, ValueError, IndexError, KeyError)
"""What pyarrow may raise on damaged bytes (found by tests/test_fuzz_trace_reader.py)."""


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def _open(path: str | os.PathLike[str]) -> pq.ParquetFile:
    p = Path(path)
    if not p.exists():
        raise TraceError(path, "no such file")
    if p.is_dir():
        raise TraceError(path, "is a directory, not a trace file")
    try:
        return pq.ParquetFile(p)
    except _CORRUPT as exc:
        raise TraceError(path, f"not a Parquet file ({_first_line(exc)})") from None


def _meta(pf: pq.ParquetFile, path: Any) -> TraceMeta:
    kv = pf.schema_arrow.metadata or {}
    if META_KEY not in kv:
        raise TraceError(path, f"no {META_KEY.decode()!r} metadata: not a moe-trace file")
    return TraceMeta.from_json(kv[META_KEY], path)


def read_meta(path: str | os.PathLike[str]) -> TraceMeta:
    """Read and check the file-level metadata of a trace (cheap: footer only)."""
    return _meta(_open(path), path)


def num_rows(path: str | os.PathLike[str]) -> int:
    return int(_open(path).metadata.num_rows)


def _embedding_cols(batch: pa.RecordBatch, row0: int, path: Any) -> dict[str, np.ndarray]:
    """The non-null embeddings of a batch as ``embedding`` ``[n, D]`` plus their global rows."""
    emb = batch.column("embedding")
    if emb.null_count == batch.num_rows:
        return {}
    vals = emb.drop_null()
    lengths = np.diff(to_numpy(vals.offsets))
    if lengths.size and (lengths != lengths[0]).any():
        raise TraceError(path, "embeddings of different lengths", column="embedding")
    mat = np.asarray(to_numpy(vals.flatten()), dtype=np.float16)
    mat = mat.reshape(len(vals), int(lengths[0]) if lengths.size else 0)
    rows = np.flatnonzero(~np.asarray(emb.is_null())) + row0
    layer = to_numpy(batch.column("layer"))[rows - row0]
    if (layer != 0).any():
        raise TraceError(path, "embedding on a row whose layer is not 0",
                         row=int(rows[first_bad_row(layer != 0)]), column="embedding")
    bad = ~np.isfinite(mat).all(axis=1)
    if bad.any():
        raise TraceError(path, "non-finite value", row=int(rows[first_bad_row(bad)]), column="embedding")
    return {"embedding_rows": rows, "embedding": mat}


def iter_batches(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[dict[str, np.ndarray]]:
    """Stream a trace as validated numpy column batches.

    ``columns`` restricts the optional columns returned (the required ones are always read, as
    the ordering checks need them, and ``weights`` is always validated). Memory stays in
    proportion to ``batch_rows``.
    """
    pf = _open(path)
    yield from _batches(pf, _meta(pf, path), path, columns, batch_rows)


def _batches(
    pf: pq.ParquetFile, meta: TraceMeta, path: Any, columns: Sequence[str] | None, batch_rows: int,
) -> Iterator[dict[str, np.ndarray]]:
    """:func:`iter_batches` of a file already open, its metadata read."""
    present = set(pf.schema_arrow.names)
    for col in REQUIRED_COLUMNS:
        if col not in present:
            raise TraceError(path, f"missing required column {col!r}")
    check_schema(pf.schema_arrow, path)
    if pf.metadata.num_rows == 0:
        raise TraceError(path, "has no rows")
    want = list(REQUIRED_COLUMNS)
    optional = OPTIONAL_COLUMNS if columns is None else [c for c in columns if c not in REQUIRED_COLUMNS]
    for col in optional:
        if col not in ALL_COLUMNS:
            raise ValueError(f"unknown trace column {col!r}")
        if col in present:
            want.append(col)
    # the router weights (top_k floats a row, cheap) are validated even when not asked for: a
    # file with NaN or negative weights is refused by every run, not only the runs that read them
    unasked = [c for c in ("weights",) if c in present and c not in want]
    cursor = Cursor()
    threads = pf.metadata.num_rows >= THREADED_ROWS
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, columns=want + unasked, use_threads=threads):
            cols = validate_batch(batch, meta, cursor, path)
            for col in unasked:
                cols.pop(col, None)
            if "embedding" in want:
                cols.update(_embedding_cols(batch, cursor.row - batch.num_rows, path))
            yield cols
    except TraceError:
        raise
    except _CORRUPT as exc:
        raise TraceError(path, f"unreadable Parquet data ({_first_line(exc)})") from None
    check_complete(cursor, meta, path)


THREADED_ROWS = 1 << 20
"""Rows from which a trace's columns are decoded on Arrow's thread pool. Below, the pool's
start and hand-offs cost more CPU than they spread (128,000 rows: ~2 ms of CPU a read, and now
and then ~50 ms when its workers spin for a core another process holds); the columns are the
same either way."""


@dataclass
class Trace:
    """A trace held in memory as numpy columns (one entry per row unless noted).

    ``experts`` is ``[rows, top_k]`` int16; ``weights`` ``[rows, top_k]`` float32;
    ``logits``/``lookahead_logits`` ``[rows, E]`` float16; ``embedding`` is ``[n, D]`` for the
    rows listed in ``embedding_rows``. Optional columns the file lacks are ``None``.
    """

    meta: TraceMeta
    request_id: np.ndarray
    token_idx: np.ndarray
    phase: np.ndarray
    layer: np.ndarray
    experts: np.ndarray
    weights: np.ndarray | None = None
    logits: np.ndarray | None = None
    lookahead_logits: np.ndarray | None = None
    token_id: np.ndarray | None = None
    embedding: np.ndarray | None = None
    embedding_rows: np.ndarray | None = None
    path: str | None = None

    @property
    def num_rows(self) -> int:
        return int(self.request_id.shape[0])

    @property
    def model(self) -> ModelInfo:
        return self.meta.model

    def columns(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name in ("request_id", "token_idx", "phase", "layer", "experts", "weights", "logits",
                     "lookahead_logits", "token_id", "embedding", "embedding_rows"):
            val = getattr(self, name)
            if val is not None:
                out[name] = val
        return out


class _Columns:
    """The batches' columns copied into whole-trace arrays as they come, when the row count is
    known (a file's footer gives it): the trace is held once, not as batches and then as their
    concatenation. A column whose batches do not add up to the rows (``embedding``: one row a
    token) or change shape is concatenated at the end."""

    def __init__(self, rows: int | None) -> None:
        self.rows = rows
        self.filled: dict[str, int] = {}
        self.whole: dict[str, np.ndarray] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.batches: dict[str, int] = {}

    def add(self, cols: dict[str, np.ndarray]) -> None:
        """One batch's columns."""
        for k, v in cols.items():
            self.batches[k] = self.batches.get(k, 0) + 1
            dest = self.whole.get(k)
            at = self.filled.get(k, 0)
            if k not in self.parts and self.rows is not None and k not in _SPARSE:
                if dest is None and at == 0:
                    dest = self.whole[k] = np.empty((self.rows, *v.shape[1:]), dtype=v.dtype)
                if (dest is not None and v.dtype == dest.dtype and v.shape[1:] == dest.shape[1:]
                        and at + len(v) <= self.rows):
                    dest[at:at + len(v)] = v
                    self.filled[k] = at + len(v)
                    continue
            # another shape, or past the rows: keep the batches, joined at the end
            if dest is not None:
                self.parts[k] = [dest[:at]]
                del self.whole[k]
            self.parts.setdefault(k, []).append(v)

    def merged(self) -> dict[str, np.ndarray]:
        """Every column whole."""
        out = {k: np.concatenate(chunks) for k, chunks in self.parts.items()}
        for k, dest in self.whole.items():
            n = self.filled.get(k, 0)
            out[k] = dest if n == len(dest) else dest[:n].copy()
        return out


_SPARSE = ("embedding", "embedding_rows")
"""Columns not one entry per row."""


def _collect(meta: TraceMeta, batches: Iterable[dict[str, np.ndarray]], path: Any,
             rows: int | None = None) -> Trace:
    cols = _Columns(rows)
    for batch in batches:
        cols.add(batch)
    merged: dict[str, Any] = cols.merged()
    if not cols.batches:  # a file with no rows
        merged = {c: np.zeros(0, dtype=np.int64) for c in ("request_id", "token_idx", "layer")}
        merged["phase"] = np.zeros(0, dtype=np.int8)
        merged["experts"] = np.zeros((0, meta.model.top_k), dtype=np.int16)
    for opt in ("weights", "logits", "lookahead_logits"):
        if opt in merged and cols.batches[opt] != cols.batches["request_id"]:
            raise TraceError(path, "column is filled in some row groups and null in others", column=opt)
    return Trace(meta=meta, path=None if path is None else str(path), **merged)


def read_trace(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Trace:
    """Read and validate a whole trace into a :class:`Trace` (only the columns asked for)."""
    pf = _open(path)
    meta = _meta(pf, path)
    rows = int(pf.metadata.num_rows)
    trace = _collect(meta, _batches(pf, meta, path, columns, batch_rows), path, rows)
    if rows >= RELEASE_ROWS:
        # the decoded batches are gone: Arrow's allocator keeps their pages for reuse unless
        # told (~50 MB of a 3M-row trace, held through the whole run)
        pa.default_memory_pool().release_unused()
    return trace


RELEASE_ROWS = 1 << 20
"""Rows from which :func:`read_trace` gives Arrow's freed pages back: below, what it would
give back is small, and taking the pages again costs a short run's read ~10 ms."""


def trace_from_columns(columns: Mapping[str, Any], meta: TraceMeta) -> Trace:
    """Validate in-memory columns (as :func:`write_trace` takes them) into a :class:`Trace`
    without a file (synthetic traces in scenarios)."""
    table = build_table(columns, meta)
    cursor = Cursor()

    def batches() -> Iterator[dict[str, np.ndarray]]:
        for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS):
            row0 = cursor.row
            cols = validate_batch(batch, meta, cursor, None)
            if "embedding" in batch.schema.names:
                cols.update(_embedding_cols(batch, row0, None))
            yield cols
        check_complete(cursor, meta, None)

    return _collect(meta, batches(), None)


# --------------------------------------------------------------------------------------------
# Writing


def _list_array(mat: Any, value_type: pa.DataType, rows: int, column: str) -> pa.Array:
    """Build a list array from a 2-D matrix (fast path) or a sequence of sequences/None."""
    if isinstance(mat, pa.Array | pa.ChunkedArray):
        return mat.cast(pa.list_(value_type)) if mat.type != pa.list_(value_type) else mat
    if isinstance(mat, np.ndarray) and mat.ndim == 2:
        if mat.shape[0] != rows:
            raise ValueError(f"column {column!r} has {mat.shape[0]} rows, expected {rows}")
        width = mat.shape[1]
        flat = pa.array(np.ascontiguousarray(mat).reshape(-1), type=value_type)
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width, type=pa.int32())
        return pa.ListArray.from_arrays(offsets, flat)
    seq = list(mat)
    if len(seq) != rows:
        raise ValueError(f"column {column!r} has {len(seq)} rows, expected {rows}")
    return pa.array([None if v is None else np.asarray(v).tolist() for v in seq], type=pa.list_(value_type))


def embedding_list_array(emb: np.ndarray, emb_rows: np.ndarray, rows: int) -> pa.ListArray:
    """The ``embedding`` column as a list array of ``rows`` entries: ``emb[i]`` at row
    ``emb_rows[i]`` (ascending), null elsewhere; built without a Python loop."""
    emb_rows = np.asarray(emb_rows, dtype=np.int64)
    if emb_rows.size and (np.diff(emb_rows) <= 0).any():
        raise ValueError("embedding_rows must be strictly ascending")
    dim = emb.shape[1] if emb.ndim == 2 else 0
    present = np.zeros(rows, dtype=bool)
    present[emb_rows] = True
    offsets = np.concatenate([[0], np.cumsum(present.astype(np.int64) * dim)]).astype(np.int32)
    values = pa.array(np.ascontiguousarray(emb, dtype=np.float16).reshape(-1), type=pa.float16())
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), values, mask=pa.array(~present))


def build_table(columns: Mapping[str, Any], meta: TraceMeta) -> pa.Table:
    """Assemble a moe-trace table in the canonical schema from numpy arrays or sequences.

    Columns absent from ``columns`` are left out of the file (optional ones only).
    """
    unknown = set(columns) - set(ALL_COLUMNS) - {"embedding_rows"}
    if unknown:
        raise ValueError(f"unknown trace column(s): {', '.join(sorted(unknown))}")
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise ValueError(f"missing required column {col!r}")
    rows = len(columns["request_id"])
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for f in SCHEMA:
        name = f.name
        if name not in columns:
            continue
        val = columns[name]
        if name == "phase":
            if isinstance(val, np.ndarray) and val.dtype.kind in "iu":
                idx = pa.array(np.asarray(val, dtype=np.int8), type=pa.int8())
            else:
                idx = pa.array([PHASES.index(str(v)) for v in val], type=pa.int8())
            arr: pa.Array = pa.DictionaryArray.from_arrays(idx, pa.array(list(PHASES), type=pa.string()))
        elif name == "embedding":
            emb_rows = columns.get("embedding_rows")
            if emb_rows is not None:
                arr = embedding_list_array(np.asarray(val), np.asarray(emb_rows), rows)
            else:
                arr = _list_array(val, pa.float16(), rows, name)
        elif pa.types.is_list(f.type):
            arr = _list_array(val, f.type.value_type, rows, name)
        else:
            arr = pa.array(np.asarray(val), type=f.type) if not isinstance(val, pa.Array) else val.cast(f.type)
        if len(arr) != rows:
            raise ValueError(f"column {name!r} has {len(arr)} rows, expected {rows}")
        arrays.append(arr)
        fields.append(f)
    schema = pa.schema(fields, metadata={META_KEY: meta.to_json().encode()})
    return pa.Table.from_arrays(arrays, schema=schema)


def write_trace(
    path: str | os.PathLike[str],
    columns: Mapping[str, Any] | pa.Table,
    meta: TraceMeta,
    *,
    validate: bool = True,
    row_group_rows: int = 262_144,
) -> Path:
    """Write a moe-trace v1 file atomically (temp file + rename): on any error, Ctrl-C or
    SIGTERM, nothing is left at ``path``; an existing file is replaced. The data is validated
    first unless ``validate=False``. A place that cannot be written (a folder, no permission)
    is a one-line :class:`~moesim.sim.core.atomic.OutputError` naming ``path``."""
    table = columns if isinstance(columns, pa.Table) else build_table(columns, meta)
    if isinstance(columns, pa.Table):
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: meta.to_json().encode()})
    if validate:
        cursor = Cursor()
        for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS):
            row0 = cursor.row
            validate_batch(batch, meta, cursor, path)
            if "embedding" in batch.schema.names:
                _embedding_cols(batch, row0, path)
        check_complete(cursor, meta, path)
    out = Path(path)
    # the temporary sibling of sim.core.atomic (.NAME.moesim-tmp-PID.parquet), removed on any
    # error, Ctrl-C or SIGTERM; a later write to the same name removes one a killed writer left
    with atomic_file(out, option="-o", force=True) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="zstd")
    return out


def iter_tokens(trace: Trace) -> Iterable[tuple[int, int, int, slice]]:
    """Yield ``(request_id, token_idx, phase, rows)`` for each (request, token) of a trace, where
    ``rows`` is the slice of its ``num_layers`` rows."""
    L = trace.model.num_layers
    for start in range(0, trace.num_rows, L):
        yield (int(trace.request_id[start]), int(trace.token_idx[start]), int(trace.phase[start]),
               slice(start, start + L))
