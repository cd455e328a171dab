"""The whole-process memory and overhead cuts keep every value: step records held once (views,
grown or reserved), a trace read into whole arrays batch by batch, batch-1 workloads built as
views, steps.parquet written one row group at a time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moesim.sim.run.outputs as outputs
from moesim.sim.engine.records import STEP_CHUNK, STEP_FIELDS, StepRecords
from moesim.sim.engine.workload import build_workload
from moesim.sim.run.runner import RunResult
from moesim.traces.format.schema import DECODE, PREFILL
from moesim.traces.format.trace_file import read_trace, write_trace
from tests.util import assert_same_trace, make_trace, random_trace


def _row(i: int) -> tuple[float | int, ...]:
    """Step ``i`` with every field set from it (floats in the time fields)."""
    return tuple(float(i) + 0.25 if dt == "float64" else (i * 7 + j) % 30000 for j, (_, dt) in enumerate(STEP_FIELDS))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "extend", "columns"]), st.integers(0, 3 * STEP_CHUNK // 2)),
                max_size=6),
       st.integers(0, 2 * STEP_CHUNK))
def test_step_records_keep_every_step_in_order(ops: list[tuple[str, int]], reserve: int) -> None:
    rec = StepRecords()
    rec.reserve(reserve)
    want: list[tuple[float | int, ...]] = []
    for op, n in ops:
        rows = [_row(len(want) + i) for i in range(n)]
        if op == "append":
            for r in rows:
                rec.append(r)
        elif op == "extend":
            rec.extend({name: [r[j] for r in rows] for j, (name, _) in enumerate(STEP_FIELDS)}, n)
        else:
            rows = []
            assert len(rec.columns()["iteration"]) == len(want)
        want += rows
        assert len(rec) == len(want)
    cols = rec.columns()
    for j, (name, dtype) in enumerate(STEP_FIELDS):
        expect = np.array([r[j] for r in want], dtype=dtype)
        assert cols[name].dtype == np.dtype(dtype) and np.array_equal(cols[name], expect), name
        assert cols[name].flags.c_contiguous and not cols[name].flags.writeable


def test_step_columns_are_views_not_copies() -> None:
    rec = StepRecords()
    rec.reserve(100)
    for i in range(100):
        rec.append(_row(i))
    a, b = rec.columns(), rec.columns()
    assert all(np.shares_memory(a[name], b[name]) for name, _ in STEP_FIELDS)
    with pytest.raises(ValueError):
        a["hits"][0] = 5


@pytest.mark.parametrize("batch_rows", [1, 7, 64, 10_000])
def test_trace_read_in_any_batch_size_is_the_same(tmp_path: Path, batch_rows: int) -> None:
    tr = random_trace(3, layers=4, requests=3, prompt=2, decode=5)
    path = tmp_path / "t.parquet"
    write_trace(path, tr.columns(), tr.meta, row_group_rows=13)
    whole = read_trace(path)
    assert_same_trace(read_trace(path, batch_rows=batch_rows), whole)
    for col in ("request_id", "experts", "lookahead_logits", "weights"):
        arr = getattr(whole, col)
        assert arr.flags.c_contiguous and arr.shape[0] == tr.num_rows


def test_batch_one_workload_as_the_lockstep_loop_makes_it() -> None:
    # request 0: 2 prompt tokens then 3 decode; request 1: decode only (3); request 2: 1 decode
    req = [0] * 5 + [1] * 3 + [2]
    ph = [PREFILL, PREFILL, DECODE, DECODE, DECODE, DECODE, DECODE, DECODE, DECODE]
    tr = make_trace(np.zeros((9, 2, 1), dtype=np.int16), num_experts=4, requests=req, phases=ph)
    wl = build_workload(tr, batch_size=1, phases=["prefill", "decode"])
    got = [(it.index, it.phase, it.rows0.tolist(), it.request_ids.tolist(), it.batch,
            it.first_of_request.tolist(), it.rows0.dtype, it.request_ids.dtype) for it in wl.iterations]
    i64 = np.dtype(np.int64)
    assert got == [
        (0, PREFILL, [0, 2], [0, 0], 0, [True, False], i64, i64),
        (1, DECODE, [4], [0], 0, [False], i64, i64),
        (2, DECODE, [6], [0], 0, [False], i64, i64),
        (3, DECODE, [8], [0], 0, [False], i64, i64),
        (4, DECODE, [10], [1], 1, [True], i64, i64),
        (5, DECODE, [12], [1], 1, [False], i64, i64),
        (6, DECODE, [14], [1], 1, [False], i64, i64),
        (7, DECODE, [16], [2], 2, [True], i64, i64),
    ]
    assert wl.decode_tokens == 7 and wl.batches == 3


def test_steps_file_is_written_one_row_group_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2500
    steps = {name: np.array([_row(i)[j] for i in range(n)], dtype=dt) for j, (name, dt) in enumerate(STEP_FIELDS)}

    res = cast(RunResult, SimpleNamespace(steps=steps))   # only the steps are read
    table = outputs.steps_table(res)
    dictionary = [c for c in table.column_names if c not in outputs.STEPS_NO_DICTIONARY]
    pq.write_table(table, tmp_path / "whole.parquet", compression="zstd", row_group_size=1000,
                   use_dictionary=dictionary)
    monkeypatch.setattr(outputs, "STEPS_ROW_GROUP", 1000)
    outputs.write_steps(res, tmp_path / "parts.parquet")
    assert (tmp_path / "parts.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    parts = pq.ParquetFile(tmp_path / "parts.parquet")
    assert parts.metadata.num_row_groups == 3
    assert parts.read().equals(table)   # the table read back is the one converted
    group = parts.metadata.row_group(0)
    encodings = {group.column(j).path_in_schema: group.column(j).encodings for j in range(group.num_columns)}
    assert all(("RLE_DICTIONARY" in e) == (c not in outputs.STEPS_NO_DICTIONARY) for c, e in encodings.items())
