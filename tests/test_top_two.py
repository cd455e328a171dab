"""One row's top-2 in :func:`~moesim.policies.parts.predictors.top_experts` (two maxima) against
its definition, the stable descending sort of the row's Python floats cut to two: the same
experts in the same order with the same floats, on rows full of ties, with -0.0 beside 0.0,
infinities (a runner-up of -inf) and NaN (both left to the sort)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.parts.predictors import top_experts

_VALUES = st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, -1.0, 3.0, float("inf"), float("-inf"), float("nan")])


def _by_sort(row: list[float], k: int) -> list[tuple[int, float]]:
    """The definition: a stable descending sort of the row's ids by score, its first ``k``."""
    return [(e, row[e]) for e in sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]]


def _same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    """Equal ids and bit-equal floats (NaN equals NaN, -0.0 differs from 0.0)."""
    return [e for e, _ in a] == [e for e, _ in b] and all(
        np.float64(x).tobytes() == np.float64(y).tobytes() for (_, x), (_, y) in zip(a, b, strict=True))


@settings(max_examples=400, deadline=None)
@given(st.lists(_VALUES, min_size=2, max_size=9), st.sampled_from([np.float16, np.float32]), st.integers(2, 3))
def test_one_rows_top_two_is_the_stable_sort(values: list[float], dtype: type, k: int) -> None:
    scores = np.array([values], dtype=dtype)
    row = scores.tolist()[0]
    got = top_experts(scores, k)
    assert _same(got, _by_sort(row, k)), (values, got)
    assert scores.tolist()[0] == row or any(v != v for v in row)   # the scores are left as they were


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=2, max_size=12))
def test_one_rows_top_two_on_any_finite_or_infinite_float32(values: list[float]) -> None:
    scores = np.array([values], dtype=np.float32)
    assert _same(top_experts(scores, 2), _by_sort(scores.tolist()[0], 2))
