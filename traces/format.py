"""The moe-trace v1 file format: schema, metadata, writer, streaming reader and validation.

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

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moesim.sim.atomic import TMP_TAG, clean_stale
from moesim.sim.errors import MoesimError
from moesim.traces.column_types import EXPECTED_KIND, kind_problem

TRACE_VERSION = 1
META_KEY = b"moe_trace"
PHASES = ("prefill", "decode")
PREFILL, DECODE = 0, 1

REQUIRED_COLUMNS = ("request_id", "token_idx", "phase", "layer", "experts")
OPTIONAL_COLUMNS = ("weights", "logits", "lookahead_logits", "token_id", "embedding")
ALL_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS

SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int32(), nullable=False),
        pa.field("token_idx", pa.int32(), nullable=False),
        pa.field("phase", pa.dictionary(pa.int8(), pa.string()), nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
        pa.field("experts", pa.list_(pa.int16()), nullable=False),
        pa.field("weights", pa.list_(pa.float32())),
        pa.field("logits", pa.list_(pa.float16())),
        pa.field("lookahead_logits", pa.list_(pa.float16())),
        pa.field("token_id", pa.int32()),
        pa.field("embedding", pa.list_(pa.float16())),
    ]
)

DEFAULT_BATCH_ROWS = 65_536


class TraceError(MoesimError, ValueError):
    """A trace that breaks the moe-trace v1 contract. ``str(err)`` is one line that names the
    file and, where it applies, the row and the column."""

    def __init__(
        self, path: str | os.PathLike[str] | None, message: str, *,
        row: int | None = None, column: str | None = None,
    ) -> None:
        where = [str(path) if path is not None else "<trace>"]
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(": ".join([", ".join(where), message]))
        self.path, self.row, self.column = path, row, column


@dataclass(frozen=True)
class ModelInfo:
    """The routed-expert shape of the traced model."""

    name: str
    num_layers: int
    num_experts: int
    top_k: int
    num_shared_experts: int = 0

    def __post_init__(self) -> None:
        for attr in ("num_layers", "num_experts", "top_k"):
            if int(getattr(self, attr)) < 1:
                raise ValueError(f"model.{attr} must be >= 1, got {getattr(self, attr)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"model.top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_shared_experts < 0:
            raise ValueError("model.num_shared_experts must be >= 0")


@dataclass(frozen=True)
class TraceMeta:
    """File-level metadata: format version, model shape and free-form provenance."""

    model: ModelInfo
    source: dict[str, Any] = field(default_factory=dict)
    version: int = TRACE_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "model": {
                    "name": self.model.name,
                    "num_layers": self.model.num_layers,
                    "num_experts": self.model.num_experts,
                    "top_k": self.model.top_k,
                    "num_shared_experts": self.model.num_shared_experts,
                },
                "source": self.source,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes, path: str | os.PathLike[str] | None = None) -> TraceMeta:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"metadata {META_KEY.decode()!r} is not valid JSON ({exc.msg})") from None
        except UnicodeDecodeError:
            raise TraceError(path, f"metadata {META_KEY.decode()!r} is not UTF-8 text") from None
        if not isinstance(obj, dict):
            raise TraceError(path, f"metadata {META_KEY.decode()!r} must be a JSON object")
        version = obj.get("version")
        if type(version) is not int or version != TRACE_VERSION:
            raise TraceError(path, f"unsupported moe-trace version {version!r} (this reader knows {TRACE_VERSION})")
        model = obj.get("model")
        if not isinstance(model, dict):
            raise TraceError(path, "metadata has no 'model' object")
        for key in ("num_layers", "num_experts", "top_k", "num_shared_experts"):
            v = model.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TraceError(path, f"metadata model.{key} must be an integer, got {v!r}")
        try:
            info = ModelInfo(
                name=str(model["name"]),
                num_layers=int(model["num_layers"]),
                num_experts=int(model["num_experts"]),
                top_k=int(model["top_k"]),
                num_shared_experts=int(model.get("num_shared_experts", 0)),
            )
        except KeyError as exc:
            raise TraceError(path, f"metadata model is missing {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise TraceError(path, f"metadata model is invalid: {exc}") from None
        source = obj.get("source", {})
        return cls(model=info, source=source if isinstance(source, dict) else {"value": source})


# --------------------------------------------------------------------------------------------
# Validation


@dataclass
class _Cursor:
    """Carries the ordering state of the previous row across record batches."""

    row: int = 0                  # global index of the next row
    key: tuple[int, int, int] | None = None   # (request, token, layer) of the previous row
    phase: int = -1               # phase of the previous row
    tok_phase: int = -1           # phase of the current (request, token)
    gap: TraceError | None = None  # the first skipped request or token id, raised at the end
    # unless an ordering error comes first (the same error whatever the batch size)


def _list_matrix(
    arr: pa.Array, width: int, column: str, path: Any, row0: int, *, dtype: Any
) -> np.ndarray:
    """Turn a list column of fixed-width rows into a ``[n, width]`` matrix, or raise on the
    first row whose length is not ``width`` or that is null."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if arr.null_count:
        bad = int(np.flatnonzero(np.asarray(arr.is_null()))[0])
        raise TraceError(path, "null value in a required list", row=row0 + bad, column=column)
    offsets = np.asarray(arr.offsets)
    lengths = np.diff(offsets)
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        i = int(wrong[0])
        raise TraceError(path, f"has {lengths[i]} entries, expected {width}", row=row0 + i, column=column)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=dtype).reshape(n, width)


def _check_finite(mat: np.ndarray, column: str, path: Any, row0: int) -> None:
    bad = ~np.isfinite(mat)
    if bad.any():
        i = int(np.flatnonzero(bad.any(axis=1))[0])
        raise TraceError(path, "non-finite value", row=row0 + i, column=column)


def _first_bad_row(mask: Any) -> int:
    return int(np.flatnonzero(mask)[0])


def validate_batch(
    batch: pa.RecordBatch | pa.Table, meta: TraceMeta, cursor: _Cursor, path: Any = None
) -> dict[str, np.ndarray]:
    """Validate one record batch against ``meta`` and the ordering state in ``cursor``, and
    return its columns as numpy arrays (``phase`` as codes ``0 = prefill, 1 = decode``).

    Raises :class:`TraceError` naming the first offending row and column.
    """
    m = meta.model
    row0 = cursor.row
    n = batch.num_rows
    names = set(batch.schema.names)
    for col in REQUIRED_COLUMNS:
        if col not in names:
            raise TraceError(path, f"missing required column {col!r}")
    out: dict[str, np.ndarray] = {}
    for col in ("request_id", "token_idx", "layer"):
        arr = batch.column(col)
        if arr.null_count:
            raise TraceError(path, "null value", row=row0 + _first_bad_row(np.asarray(arr.is_null())), column=col)
        out[col] = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
    for col in ("request_id", "token_idx"):
        neg = out[col] < 0
        if neg.any():
            raise TraceError(path, "negative value", row=row0 + _first_bad_row(neg), column=col)
    bad_layer = (out["layer"] < 0) | (out["layer"] >= m.num_layers)
    if bad_layer.any():
        i = _first_bad_row(bad_layer)
        raise TraceError(path, f"layer {out['layer'][i]} outside 0..{m.num_layers - 1}", row=row0 + i, column="layer")

    # phase: dictionary or plain strings
    ph = batch.column("phase")
    if ph.null_count:
        raise TraceError(path, "null value", row=row0 + _first_bad_row(np.asarray(ph.is_null())), column="phase")
    if pa.types.is_dictionary(ph.type):
        ph_dict = [str(v) for v in ph.dictionary.to_pylist()]
        ph_idx = np.asarray(ph.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        enc = ph.dictionary_encode()
        ph_dict = [str(v) for v in enc.dictionary.to_pylist()]
        ph_idx = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    lut = np.empty(len(ph_dict), dtype=np.int8)
    for j, name in enumerate(ph_dict):
        if name not in PHASES:
            if not (ph_idx == j).any():  # an unused dictionary entry is harmless
                lut[j] = 0
                continue
            i = _first_bad_row(ph_idx == j)
            raise TraceError(path, f"unknown phase {name!r} (expected prefill or decode)", row=row0 + i, column="phase")
        lut[j] = PHASES.index(name)
    phase = lut[ph_idx] if len(ph_dict) else np.zeros(0, dtype=np.int8)
    out["phase"] = phase

    # experts
    experts = _list_matrix(batch.column("experts"), m.top_k, "experts", path, row0, dtype=np.int64)
    bad = (experts < 0) | (experts >= m.num_experts)
    if bad.any():
        i = _first_bad_row(bad.any(axis=1))
        raise TraceError(path, f"expert id outside 0..{m.num_experts - 1}", row=row0 + i, column="experts")
    if m.top_k > 1:
        srt = np.sort(experts, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if dup.any():
            raise TraceError(path, "duplicated expert in one row", row=row0 + _first_bad_row(dup), column="experts")
    out["experts"] = experts.astype(np.int16)

    if "weights" in names and batch.column("weights").null_count < n:
        w = _list_matrix(batch.column("weights"), m.top_k, "weights", path, row0, dtype=np.float32)
        _check_finite(w, "weights", path, row0)
        negw = np.asarray((w < 0).any(axis=1))
        if negw.any():
            raise TraceError(path, "negative router weight (weights are routing probabilities)",
                             row=row0 + _first_bad_row(negw), column="weights")
        out["weights"] = w
    for col in ("logits", "lookahead_logits"):
        if col in names and batch.column(col).null_count < n:
            mat = _list_matrix(batch.column(col), m.num_experts, col, path, row0, dtype=np.float16)
            _check_finite(mat, col, path, row0)
            out[col] = mat
    if "token_id" in names:
        arr = batch.column("token_id")
        if arr.null_count < n:
            if arr.null_count:
                raise TraceError(path, "null value in a partly filled column",
                                 row=row0 + _first_bad_row(np.asarray(arr.is_null())), column="token_id")
            out["token_id"] = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int32)

    # Ordering: strictly increasing (request, token, layer); each (request, token) holds
    # layers 0..L-1 in order; within a request no prefill row follows a decode row.
    r, t, lay = out["request_id"], out["token_idx"], out["layer"]
    prev_r = np.empty(n, dtype=np.int64)
    prev_t = np.empty(n, dtype=np.int64)
    prev_l = np.empty(n, dtype=np.int64)
    prev_p = np.empty(n, dtype=np.int64)
    if n:
        if cursor.key is None:
            prev_r[0], prev_t[0], prev_l[0], prev_p[0] = -1, -1, m.num_layers - 1, -1
        else:
            prev_r[0], prev_t[0], prev_l[0] = cursor.key
            prev_p[0] = cursor.phase
        prev_r[1:], prev_t[1:], prev_l[1:], prev_p[1:] = r[:-1], t[:-1], lay[:-1], phase[:-1]
        same_tok = (r == prev_r) & (t == prev_t)
        # inside a token the layer must advance by exactly one
        bad = same_tok & (lay != prev_l + 1)
        # a new token must start at layer 0 and the previous token must have been complete
        new_tok = ~same_tok
        bad |= new_tok & ((lay != 0) | (prev_l != m.num_layers - 1))
        # tokens and requests advance
        bad |= new_tok & (r == prev_r) & (t < prev_t)
        bad |= r < prev_r
        # token_idx counts 0, 1, 2, ... inside a request; request ids follow one another
        gap = new_tok & (r == prev_r) & (t > prev_t + 1)
        gap |= new_tok & (r != prev_r) & (t != 0)
        gap |= (r > prev_r + 1) & (prev_r >= 0)
        if gap.any() and cursor.gap is None:
            i = _first_bad_row(gap)
            if r[i] != prev_r[i] and r[i] > prev_r[i] + 1 and prev_r[i] >= 0:
                cursor.gap = TraceError(path, f"request {r[i]} follows request {prev_r[i]}: request ids must not "
                                        "skip", row=row0 + i, column="request_id")
            else:
                want = 0 if r[i] != prev_r[i] else prev_t[i] + 1
                cursor.gap = TraceError(path, f"token_idx {t[i]} of request {r[i]} where {want} was due: a token "
                                        "missing (tokens count 0, 1, 2, ... inside a request)",
                                        row=row0 + i, column="token_idx")
        if bad.any():
            i = _first_bad_row(bad)
            col = "layer" if (same_tok[i] or lay[i] != 0 or prev_l[i] != m.num_layers - 1) else "token_idx"
            if r[i] < prev_r[i]:
                col = "request_id"
            what = "missing layers" if col == "layer" and not same_tok[i] and prev_l[i] != m.num_layers - 1 else "rows out of order"
            if col == "layer" and same_tok[i] and lay[i] > prev_l[i] + 1:
                what = "missing layers"
            raise TraceError(path, f"{what} (request {r[i]}, token {t[i]}, layer {lay[i]})", row=row0 + i, column=col)
        # phase constant within a token; no prefill after decode within a request
        bad_phase = same_tok & (phase != prev_p)
        bad_phase |= (r == prev_r) & (prev_p == DECODE) & (phase == PREFILL)
        if bad_phase.any():
            i = _first_bad_row(bad_phase)
            raise TraceError(path, "phase changes inside a token or prefill follows decode", row=row0 + i, column="phase")
        cursor.key = (int(r[-1]), int(t[-1]), int(lay[-1]))
        cursor.phase = int(phase[-1])
    cursor.row += n
    return out


def _check_complete(cursor: _Cursor, meta: TraceMeta, path: Any) -> None:
    if cursor.key is not None and cursor.key[2] != meta.model.num_layers - 1:
        raise TraceError(path, f"missing layers at the end (last token stops at layer {cursor.key[2]})",
                         row=cursor.row - 1, column="layer")
    if cursor.gap is not None:
        raise cursor.gap


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


def read_meta(path: str | os.PathLike[str]) -> TraceMeta:
    """Read and check the file-level metadata of a trace (cheap: footer only)."""
    pf = _open(path)
    kv = pf.schema_arrow.metadata or {}
    if META_KEY not in kv:
        raise TraceError(path, f"no {META_KEY.decode()!r} metadata: not a moe-trace file")
    return TraceMeta.from_json(kv[META_KEY], path)


def num_rows(path: str | os.PathLike[str]) -> int:
    return int(_open(path).metadata.num_rows)


def _embedding_cols(batch: pa.RecordBatch, row0: int, path: Any) -> dict[str, np.ndarray]:
    """The non-null embeddings of a batch as ``embedding`` ``[n, D]`` plus their global rows."""
    emb = batch.column("embedding")
    if emb.null_count == batch.num_rows:
        return {}
    vals = emb.drop_null()
    lengths = np.diff(np.asarray(vals.offsets))
    if lengths.size and (lengths != lengths[0]).any():
        raise TraceError(path, "embeddings of different lengths", column="embedding")
    mat = np.asarray(vals.flatten().to_numpy(zero_copy_only=False), dtype=np.float16)
    mat = mat.reshape(len(vals), int(lengths[0]) if lengths.size else 0)
    rows = np.flatnonzero(~np.asarray(emb.is_null())) + row0
    layer = np.asarray(batch.column("layer").to_numpy(zero_copy_only=False))[rows - row0]
    if (layer != 0).any():
        raise TraceError(path, "embedding on a row whose layer is not 0",
                         row=int(rows[_first_bad_row(layer != 0)]), column="embedding")
    bad = ~np.isfinite(mat).all(axis=1)
    if bad.any():
        raise TraceError(path, "non-finite value", row=int(rows[_first_bad_row(bad)]), column="embedding")
    return {"embedding_rows": rows, "embedding": mat}


def iter_batches(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[dict[str, np.ndarray]]:
    """Stream a trace as validated numpy column batches.

    ``columns`` restricts the optional columns read (the required ones are always read, as the
    ordering checks need them). Memory stays in proportion to ``batch_rows``.
    """
    pf = _open(path)
    meta = read_meta(path)
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
    cursor = _Cursor()
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, columns=want):
            cols = validate_batch(batch, meta, cursor, path)
            if "embedding" in want:
                cols.update(_embedding_cols(batch, cursor.row - batch.num_rows, path))
            yield cols
    except TraceError:
        raise
    except _CORRUPT as exc:
        raise TraceError(path, f"unreadable Parquet data ({_first_line(exc)})") from None
    _check_complete(cursor, meta, path)


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


def _collect(meta: TraceMeta, batches: Iterable[dict[str, np.ndarray]], path: Any) -> Trace:
    parts: dict[str, list[np.ndarray]] = {}
    for cols in batches:
        for k, v in cols.items():
            parts.setdefault(k, []).append(v)
    merged: dict[str, Any] = {k: np.concatenate(chunks) for k, chunks in parts.items()}
    if not parts:  # a file with no rows
        merged = {c: np.zeros(0, dtype=np.int64) for c in ("request_id", "token_idx", "layer")}
        merged["phase"] = np.zeros(0, dtype=np.int8)
        merged["experts"] = np.zeros((0, meta.model.top_k), dtype=np.int16)
    for opt in ("weights", "logits", "lookahead_logits"):
        if opt in merged and len(parts[opt]) != len(parts["request_id"]):
            raise TraceError(path, "column is filled in some row groups and null in others", column=opt)
    return Trace(meta=meta, path=None if path is None else str(path), **merged)


def read_trace(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Trace:
    """Read and validate a whole trace into a :class:`Trace` (only the columns asked for)."""
    meta = read_meta(path)
    return _collect(meta, iter_batches(path, columns, batch_rows=batch_rows), path)


def trace_from_columns(columns: Mapping[str, Any], meta: TraceMeta) -> Trace:
    """Validate in-memory columns (as :func:`write_trace` takes them) into a :class:`Trace`
    without a file (synthetic traces in scenarios)."""
    table = build_table(columns, meta)
    cursor = _Cursor()

    def batches() -> Iterator[dict[str, np.ndarray]]:
        for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS):
            row0 = cursor.row
            cols = validate_batch(batch, meta, cursor, None)
            if "embedding" in batch.schema.names:
                cols.update(_embedding_cols(batch, row0, None))
            yield cols
        _check_complete(cursor, meta, None)

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
    """Write a moe-trace v1 file atomically (temp file + rename): on any error, nothing is
    left at ``path``. The data is validated first unless ``validate=False``."""
    table = columns if isinstance(columns, pa.Table) else build_table(columns, meta)
    if isinstance(columns, pa.Table):
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: meta.to_json().encode()})
    if validate:
        cursor = _Cursor()
        for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS):
            row0 = cursor.row
            validate_batch(batch, meta, cursor, path)
            if "embedding" in batch.schema.names:
                _embedding_cols(batch, row0, path)
        _check_complete(cursor, meta, path)
    out = Path(path)
    if out.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    # the temporary sibling of sim.atomic (.NAME.moesim-tmp-PID.parquet): a later write to the
    # same name removes one a killed writer left
    clean_stale(out)
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}{out.suffix}"
    try:
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="zstd")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def iter_tokens(trace: Trace) -> Iterable[tuple[int, int, int, slice]]:
    """Yield ``(request_id, token_idx, phase, rows)`` for each (request, token) of a trace, where
    ``rows`` is the slice of its ``num_layers`` rows."""
    L = trace.model.num_layers
    for start in range(0, trace.num_rows, L):
        yield (int(trace.request_id[start]), int(trace.token_idx[start]), int(trace.phase[start]),
               slice(start, start + L))
