"""A float16 column's finiteness is checked on its bits (:func:`moesim.traces.format.validation._check_finite`):
it refuses exactly the values ``numpy.isfinite`` calls non-finite, over every one of the 65,536
half-precision bit patterns, and names the first row holding one."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.traces.format.schema import TraceError
from moesim.traces.format.validation import _check_finite


def test_every_half_precision_value_is_judged_as_isfinite_judges_it() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.isfinite(every)
    assert 0 < finite.sum() < len(every)
    for value, ok in zip(every, finite, strict=True):
        row = np.zeros((1, 4), dtype=np.float16)
        row[0, 2] = value
        if ok:
            _check_finite(row, "logits", "t.parquet", 0)
        else:
            with pytest.raises(TraceError, match="non-finite"):
                _check_finite(row, "logits", "t.parquet", 0)


def test_the_first_row_with_a_nan_is_named() -> None:
    mat = np.ones((6, 8), dtype=np.float16)
    mat[4, 7] = np.nan
    mat[5, 0] = -np.inf
    with pytest.raises(TraceError) as err:
        _check_finite(mat, "lookahead_logits", "t.parquet", 100)
    assert "row 104" in str(err.value) and "lookahead_logits" in str(err.value)
