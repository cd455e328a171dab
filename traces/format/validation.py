"""Validation of moe-trace v1 rows: one record batch at a time, carrying the ordering state
across batches (:class:`Cursor`), so that a file larger than memory is checked as it streams.

Every problem raises :class:`~traces.schema.TraceError`, one line naming the file, the row
and the column; :mod:`traces.format` calls this while reading and before writing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from moesim.traces.format.arrow_numpy import to_numpy
from moesim.traces.format.schema import (
    DECODE,
    PHASES,
    PREFILL,
    REQUIRED_COLUMNS,
    TraceError,
    TraceMeta,
)


@dataclass
class Cursor:
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
    offsets = to_numpy(arr.offsets)
    lengths = np.diff(offsets)
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        i = int(wrong[0])
        raise TraceError(path, f"has {lengths[i]} entries, expected {width}", row=row0 + i, column=column)
    values = to_numpy(arr.values)[offsets[0]:offsets[-1]] if n else to_numpy(arr.flatten())   # no nulls here
    with np.errstate(over="ignore"):   # a float too large for ``dtype`` becomes inf, which the caller reports
        mat = np.asarray(values, dtype=dtype).reshape(n, width)
    if mat.dtype.kind == "f" and values.dtype.kind == "f" and values.dtype.itemsize > mat.dtype.itemsize:
        over = np.isinf(mat) & np.isfinite(values.reshape(n, width))
        if over.any():
            i = first_bad_row(over.any(axis=1))
            raise TraceError(path, f"value beyond the range of {np.dtype(dtype).name}", row=row0 + i, column=column)
    return mat


_F16_EXPONENT = np.uint16(0x7C00)
"""The exponent bits of an IEEE half: all set in an infinity or a NaN, and only there."""


def _check_finite(mat: np.ndarray, column: str, path: Any, row0: int) -> None:
    if mat.dtype == np.float16:   # on the bits: numpy's float16 isfinite is ~10x slower
        bad = (mat.view(np.uint16) & _F16_EXPONENT) == _F16_EXPONENT
    else:
        bad = ~np.isfinite(mat)
    if bad.any():
        i = int(np.flatnonzero(bad.any(axis=1))[0])
        raise TraceError(path, "non-finite value", row=row0 + i, column=column)


def first_bad_row(mask: Any) -> int:
    """Index of the first true entry of a boolean row mask (the caller knows one is true)."""
    return int(np.flatnonzero(mask)[0])


def validate_batch(
    batch: pa.RecordBatch | pa.Table, meta: TraceMeta, cursor: Cursor, path: Any = None
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
            raise TraceError(path, "null value", row=row0 + first_bad_row(np.asarray(arr.is_null())), column=col)
        out[col] = np.asarray(to_numpy(arr), dtype=np.int64)
    for col in ("request_id", "token_idx"):
        neg = out[col] < 0
        if neg.any():
            raise TraceError(path, "negative value", row=row0 + first_bad_row(neg), column=col)
    bad_layer = (out["layer"] < 0) | (out["layer"] >= m.num_layers)
    if bad_layer.any():
        i = first_bad_row(bad_layer)
        raise TraceError(path, f"layer {out['layer'][i]} outside 0..{m.num_layers - 1}", row=row0 + i, column="layer")

    # phase: dictionary or plain strings
    ph = batch.column("phase")
    if ph.null_count:
        raise TraceError(path, "null value", row=row0 + first_bad_row(np.asarray(ph.is_null())), column="phase")
    if pa.types.is_dictionary(ph.type):
        ph_dict = [str(v) for v in ph.dictionary.to_pylist()]
        ph_idx = np.asarray(to_numpy(ph.indices), dtype=np.int64)
    else:
        enc = ph.dictionary_encode()
        ph_dict = [str(v) for v in enc.dictionary.to_pylist()]
        ph_idx = np.asarray(to_numpy(enc.indices), dtype=np.int64)
    lut = np.empty(len(ph_dict), dtype=np.int8)
    for j, name in enumerate(ph_dict):
        if name not in PHASES:
            if not (ph_idx == j).any():  # an unused dictionary entry is harmless
                lut[j] = 0
                continue
            i = first_bad_row(ph_idx == j)
            raise TraceError(path, f"unknown phase {name!r} (expected prefill or decode)", row=row0 + i, column="phase")
        lut[j] = PHASES.index(name)
    phase = lut[ph_idx] if len(ph_dict) else np.zeros(0, dtype=np.int8)
    out["phase"] = phase

    # experts
    experts = _list_matrix(batch.column("experts"), m.top_k, "experts", path, row0, dtype=np.int64)
    bad = (experts < 0) | (experts >= m.num_experts)
    if bad.any():
        i = first_bad_row(bad.any(axis=1))
        raise TraceError(path, f"expert id outside 0..{m.num_experts - 1}", row=row0 + i, column="experts")
    if m.top_k > 1:
        if m.top_k <= 6:   # every pair of columns: cheaper than sorting each row while k is small
            dup = np.zeros(n, dtype=bool)
            for i in range(m.top_k):
                for j in range(i + 1, m.top_k):
                    dup |= experts[:, i] == experts[:, j]
        else:
            srt = np.sort(experts, axis=1)
            dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if dup.any():
            raise TraceError(path, "duplicated expert in one row", row=row0 + first_bad_row(dup), column="experts")
    out["experts"] = experts.astype(np.int16)

    if "weights" in names and batch.column("weights").null_count < n:
        w = _list_matrix(batch.column("weights"), m.top_k, "weights", path, row0, dtype=np.float32)
        _check_finite(w, "weights", path, row0)
        negw = w < 0
        if negw.any():
            raise TraceError(path, "negative router weight (weights are routing probabilities)",
                             row=row0 + first_bad_row(negw.any(axis=1)), column="weights")
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
                                 row=row0 + first_bad_row(np.asarray(arr.is_null())), column="token_id")
            out["token_id"] = np.asarray(to_numpy(arr), dtype=np.int32)

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
            i = first_bad_row(gap)
            if r[i] != prev_r[i] and r[i] > prev_r[i] + 1 and prev_r[i] >= 0:
                cursor.gap = TraceError(path, f"request {r[i]} follows request {prev_r[i]}: request ids must not "
                                        "skip", row=row0 + i, column="request_id")
            else:
                want = 0 if r[i] != prev_r[i] else prev_t[i] + 1
                cursor.gap = TraceError(path, f"token_idx {t[i]} of request {r[i]} where {want} was due: a token "
                                        "missing (tokens count 0, 1, 2, ... inside a request)",
                                        row=row0 + i, column="token_idx")
        if bad.any():
            i = first_bad_row(bad)
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
            i = first_bad_row(bad_phase)
            raise TraceError(path, "phase changes inside a token or prefill follows decode", row=row0 + i, column="phase")
        cursor.key = (int(r[-1]), int(t[-1]), int(lay[-1]))
        cursor.phase = int(phase[-1])
    cursor.row += n
    return out


def check_complete(cursor: Cursor, meta: TraceMeta, path: Any) -> None:
    """After the last batch: the last token must hold every layer, and no request or token id
    may have been skipped (the gap :func:`validate_batch` noted is raised now)."""
    if cursor.key is not None and cursor.key[2] != meta.model.num_layers - 1:
        raise TraceError(path, f"missing layers at the end (last token stops at layer {cursor.key[2]})",
                         row=cursor.row - 1, column="layer")
    if cursor.gap is not None:
        raise cursor.gap
