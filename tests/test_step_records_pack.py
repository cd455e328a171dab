"""StepRecords.pack reads a chunk of rows as one float64 matrix where that gives exactly what
reading each field in its own type gives, and falls back to the per-field read elsewhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.sim.engine.records import STEP_FIELDS, StepRecords


def _reference(rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
    """Each field read in its own type (what pack did before the matrix read)."""
    return {name: np.fromiter(values, dtype=dtype, count=len(rows))
            for (name, dtype), values in zip(STEP_FIELDS, zip(*rows, strict=True), strict=True)}


def _packed(rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
    rec = StepRecords()
    for row in rows:
        rec.append(row)
    return rec.columns()


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def _row(i: int, **changes: Any) -> tuple[Any, ...]:
    base = {"iteration": i, "layer": i % 32, "t_start": 0.1 * i, "t_route": 0.1 * i + 0.01,
            "t_end": 0.1 * i + 0.05, "n_experts": 2, "hits": 1, "late": 0, "partial": 0, "misses": 1,
            "cpu_experts": 0, "stall_s": 1e-3 * i, "demand_bytes": 352_321_536, "prefetch_bytes": 0,
            "evictions": 1}
    base.update(changes)
    return tuple(base[name] for name, _ in STEP_FIELDS)


def test_plain_rows_pack_exactly() -> None:
    rows = [_row(i) for i in range(1000)]
    assert _same(_packed(rows), _reference(rows))


@pytest.mark.parametrize("changes", [
    {"hits": 1.5},                        # a fraction in an integer field: truncated, as fromiter does
    {"demand_bytes": 2 ** 53 + 1},        # an int64 beyond a float64's exact integers
    {"t_start": float("nan")},            # a NaN
    {"t_end": None},                      # a None in a float field: a NaN either way
    {"stall_s": -0.0},                    # the sign of zero kept
    {"evictions": True},                  # a bool reads as 1
])
def test_edge_values_give_what_the_per_field_read_gives(changes: dict[str, Any]) -> None:
    rows = [_row(0), _row(1, **changes), _row(2)]
    assert _same(_packed(rows), _reference(rows))


@pytest.mark.parametrize("changes", [{"hits": 70_000}, {"misses": None}])
def test_values_the_per_field_read_refuses_are_refused(changes: dict[str, Any]) -> None:
    rows = [_row(0), _row(1, **changes)]
    with pytest.raises((OverflowError, TypeError)):
        _reference(rows)
    with pytest.raises((OverflowError, TypeError)):
        _packed(rows)


_INT = {"int16": st.integers(-2 ** 15, 2 ** 15 - 1), "int32": st.integers(-2 ** 31, 2 ** 31 - 1),
        "int64": st.integers(-2 ** 63, 2 ** 63 - 1),
        "float64": st.floats(allow_nan=False, width=64)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*(_INT[dtype] for _, dtype in STEP_FIELDS)), min_size=1, max_size=40))
def test_any_rows_pack_as_the_per_field_read(rows: list[tuple[Any, ...]]) -> None:
    assert _same(_packed(rows), _reference(rows))
