"""Numeric Arrow arrays to and from numpy over their buffers, without pyarrow's pandas-backed
conversions: ``Array.to_numpy`` and ``pa.array`` import pandas (about 0.2 s, most of a short
``simctl run``), though a trace's columns are plain numbers.

Only integer and floating arrays without nulls take the buffer path; anything else (booleans,
strings, nulls) goes through pyarrow's own conversion, so the values are the same either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

_FLOATS: dict[int, np.dtype[Any]] = {16: np.dtype(np.float16), 32: np.dtype(np.float32), 64: np.dtype(np.float64)}


def _numpy_dtype(t: pa.DataType) -> np.dtype[Any] | None:
    if pa.types.is_integer(t):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_floating(t):
        return _FLOATS[t.bit_width]
    return None


def to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of ``arr`` as a numpy array (a read-only view of its buffer when it is a
    numeric array without nulls, as ``to_numpy`` gives it)."""
    if isinstance(arr, pa.ChunkedArray):
        parts = [to_numpy(c) for c in arr.chunks]
        if len(parts) == 1:
            return parts[0]
        if parts:
            return np.concatenate(parts)
        arr = arr.combine_chunks()
    dtype = _numpy_dtype(arr.type)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    data = arr.buffers()[1]
    n, off = len(arr), arr.offset
    if data is None:   # an empty array may have no data buffer
        return np.zeros(0, dtype=dtype)
    out = np.frombuffer(data, dtype=dtype, count=n + off)[off:]
    out.flags.writeable = False
    return out


_ARROW = {np.dtype(t): f() for t, f in (
    (np.int8, pa.int8), (np.int16, pa.int16), (np.int32, pa.int32), (np.int64, pa.int64),
    (np.uint8, pa.uint8), (np.uint16, pa.uint16), (np.uint32, pa.uint32), (np.uint64, pa.uint64),
    (np.float16, pa.float16), (np.float32, pa.float32), (np.float64, pa.float64))}


def from_numpy(values: np.ndarray) -> pa.Array:
    """A one-dimensional numeric numpy array as an Arrow array of the same type (no nulls)."""
    values = np.ascontiguousarray(values)
    t = _ARROW.get(values.dtype)
    if t is None or values.ndim != 1:
        raise TypeError(f"from_numpy takes a one-dimensional numeric array, got {values.dtype} x {values.ndim}")
    return pa.Array.from_buffers(t, len(values), [None, pa.py_buffer(values)])
