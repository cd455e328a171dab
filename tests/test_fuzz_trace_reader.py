"""Hypothesis fuzzing of the trace reader: random mutations of a small valid moe-trace file
(values, Arrow types, row order, metadata, raw bytes) either read or raise the project's
one-line error naming the file; never any other exception."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import META_KEY, ModelInfo, TraceMeta, build_table, read_trace

META = TraceMeta(model=ModelInfo(name="fuzz", num_layers=2, num_experts=4, top_k=2))
TOKENS = [(0, 0, "prefill"), (0, 1, "decode"), (0, 2, "decode"), (1, 0, "decode"), (1, 1, "decode")]


def valid_table() -> pa.Table:
    """2 requests, 5 tokens, 2 layers, E=4, k=2, with weights, logits and token ids."""
    rng = np.random.default_rng(0)
    req, tok, ph, lay, ex = [], [], [], [], []
    for r, t, p in TOKENS:
        for layer in range(2):
            req.append(r)
            tok.append(t)
            ph.append(0 if p == "prefill" else 1)
            lay.append(layer)
            ex.append(rng.permutation(4)[:2])
    n = len(req)
    logits = rng.standard_normal((n, 4)).astype(np.float16)
    cols: dict[str, Any] = {"request_id": np.array(req), "token_idx": np.array(tok), "phase": np.array(ph),
                            "layer": np.array(lay), "experts": np.array(ex),
                            "weights": np.full((n, 2), 0.4, dtype=np.float32), "logits": logits,
                            "lookahead_logits": logits, "token_id": np.arange(n)}
    return build_table(cols, META)


def _value_for(t: pa.DataType, draw: Any) -> Any:
    if pa.types.is_list(t):
        return draw(st.one_of(st.none(), st.lists(st.one_of(st.integers(-3, 70000), st.floats(allow_nan=True)),
                                                   max_size=5)))
    if pa.types.is_dictionary(t) or pa.types.is_string(t):
        return draw(st.sampled_from(["prefill", "decode", "prefil", "", None]))
    return draw(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)))


@st.composite
def mutated(draw: Any) -> tuple[str, Any]:
    """One mutation of the valid table: ("table", table) or ("bytes", edit spec)."""
    table = valid_table()
    kind = draw(st.sampled_from(["value", "type", "rows", "drop", "meta", "bytes"]))
    if kind == "value":
        name = draw(st.sampled_from(table.column_names))
        col = table.column(name)
        values = col.to_pylist()
        i = draw(st.integers(0, len(values) - 1))
        values[i] = _value_for(col.type, draw)
        typ = pa.list_(pa.float64()) if pa.types.is_list(col.type) and values[i] and any(
            isinstance(v, float) for v in values[i]) else (pa.string() if pa.types.is_dictionary(col.type) else None)
        try:
            arr = pa.array(values, type=typ or col.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            arr = pa.array([None if v is None else str(v) for v in values], type=pa.string())
        return "table", table.set_column(table.schema.get_field_index(name), name, arr)
    if kind == "type":
        name = draw(st.sampled_from(table.column_names))
        target = draw(st.sampled_from([pa.string(), pa.float64(), pa.int8(), pa.list_(pa.int64()),
                                       pa.list_(pa.list_(pa.int16())), pa.large_list(pa.float32())]))
        values = table.column(name).to_pylist()
        try:
            arr = pa.array(values, type=target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError):
            arr = pa.array([json.dumps(v) for v in values], type=pa.string())
        return "table", table.set_column(table.schema.get_field_index(name), name, arr)
    if kind == "rows":
        order = draw(st.permutations(range(table.num_rows)))
        keep = draw(st.integers(0, table.num_rows))
        return "table", table.take(pa.array(list(order)[:keep], type=pa.int64()))
    if kind == "drop":
        return "table", table.drop_columns([draw(st.sampled_from(table.column_names))])
    if kind == "meta":
        meta = json.loads(META.to_json())
        key = draw(st.sampled_from(["version", "num_layers", "num_experts", "top_k", "name"]))
        value = draw(st.one_of(st.none(), st.integers(-2, 10), st.text(max_size=3), st.floats(allow_nan=True)))
        if key in meta:
            meta[key] = value
        else:
            meta["model"][key] = value
        return "table", table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    return "bytes", (draw(st.integers(0, 10**6)), draw(st.binary(min_size=1, max_size=16)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=mutated())
def test_reader_reads_or_says_one_line(tmp_path: Path, m: tuple[str, Any]) -> None:
    path = tmp_path / "f.parquet"
    kind, payload = m
    if kind == "table":
        pq.write_table(payload, path)
    else:
        pq.write_table(valid_table(), path)
        data = bytearray(path.read_bytes())
        at, patch = payload
        at %= len(data)
        data[at: at + len(patch)] = patch
        path.write_bytes(bytes(data))
    try:
        read_trace(path)
    except MoesimError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith(str(path)), msg


def test_the_valid_table_reads(tmp_path: Path) -> None:
    path = tmp_path / "ok.parquet"
    pq.write_table(valid_table(), path)
    assert read_trace(path).experts.shape == (10, 2)


@pytest.mark.parametrize("target", [pa.string(), pa.float32(), pa.list_(pa.list_(pa.int16()))])
def test_experts_of_another_type_are_named(tmp_path: Path, target: pa.DataType) -> None:
    t = valid_table()
    values = t.column("experts").to_pylist()
    arr = pa.array([json.dumps(v) for v in values]) if target == pa.string() else (
        pa.array([float(v[0]) for v in values], type=target) if target == pa.float32() else pa.array([[v] for v in values], type=target))
    path = tmp_path / "t.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("experts"), "experts", arr), path)
    with pytest.raises(MoesimError, match="column 'experts': has Arrow type"):
        read_trace(path)
