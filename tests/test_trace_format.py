"""moe-trace v1: round trip of every column, streaming, and each validation error of DESIGN.md
section 2, from the API (a one-line TraceError naming file, row and column) and from the CLI
(exit 2, one stderr line, no traceback)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moesim.sim.cli.main import main
from moesim.traces.format.trace_file import (
    META_KEY,
    ModelInfo,
    TraceError,
    TraceMeta,
    build_table,
    iter_batches,
    read_meta,
    read_trace,
    write_trace,
)

MODEL = ModelInfo(name="tiny", num_layers=3, num_experts=6, top_k=2, num_shared_experts=1)
META = TraceMeta(model=MODEL, source={"test": "format", "nested": {"a": [1, 2]}})


def full_columns(seed: int = 0) -> dict[str, Any]:
    """Two requests (3 + 2 tokens, the first with 2 prefill tokens), every column filled."""
    rng = np.random.default_rng(seed)
    L, E, k = MODEL.num_layers, MODEL.num_experts, MODEL.top_k
    req = np.array([0, 0, 0, 1, 1])
    tok = np.array([0, 1, 2, 0, 1])
    ph = np.array([0, 0, 1, 1, 1], dtype=np.int8)
    T = req.size
    logits = rng.standard_normal((T * L, E)).astype(np.float16)
    experts = np.argsort(-logits.astype(np.float32), axis=1)[:, :k].astype(np.int16)
    return {
        "request_id": np.repeat(req, L).astype(np.int32),
        "token_idx": np.repeat(tok, L).astype(np.int32),
        "phase": np.repeat(ph, L),
        "layer": np.tile(np.arange(L, dtype=np.int16), T),
        "experts": experts,
        "weights": rng.random((T * L, k)).astype(np.float32),
        "logits": logits,
        "lookahead_logits": rng.standard_normal((T * L, E)).astype(np.float16),
        "token_id": rng.integers(0, 50_000, T * L).astype(np.int32),
        "embedding": rng.standard_normal((T, 4)).astype(np.float16),
        "embedding_rows": np.arange(T) * L,
    }


def test_round_trip_every_column(tmp_path: Path) -> None:
    cols = full_columns()
    path = write_trace(tmp_path / "t.parquet", cols, META)
    tr = read_trace(path)
    assert tr.meta == META
    assert read_meta(path) == META
    for name, want in cols.items():
        got = getattr(tr, name)
        assert got is not None, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert tr.experts.dtype == np.int16 and tr.logits is not None and tr.logits.dtype == np.float16
    # streaming in tiny batches (tokens split across batches) gives the same rows
    parts = list(iter_batches(path, batch_rows=4))
    assert len(parts) == 4
    for name in ("request_id", "layer", "experts", "weights", "lookahead_logits", "embedding", "embedding_rows"):
        np.testing.assert_array_equal(np.concatenate([p[name] for p in parts if name in p]), cols[name])


def test_optional_columns_absent_and_subset(tmp_path: Path) -> None:
    cols = {k: v for k, v in full_columns().items() if k in ("request_id", "token_idx", "phase", "layer", "experts")}
    path = write_trace(tmp_path / "t.parquet", cols, META)
    tr = read_trace(path)
    assert tr.weights is None and tr.logits is None and tr.embedding is None
    full = write_trace(tmp_path / "f.parquet", full_columns(), META)
    only = read_trace(full, ["weights"])
    assert only.weights is not None and only.logits is None and only.token_id is None


def test_phase_as_strings_and_file_mode(tmp_path: Path) -> None:
    cols = full_columns()
    cols["phase"] = ["prefill" if p == 0 else "decode" for p in cols["phase"]]
    path = write_trace(tmp_path / "t.parquet", cols, META)
    np.testing.assert_array_equal(read_trace(path).phase, full_columns()["phase"])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# --------------------------------------------------------------------------------------------
# Validation: each case of DESIGN.md section 2


def _raw_write(path: Path, table: pa.Table, meta_json: str | None) -> Path:
    md = dict(table.schema.metadata or {})
    if meta_json is None:
        md.pop(META_KEY, None)
    else:
        md[META_KEY] = meta_json.encode()
    pq.write_table(table.replace_schema_metadata(md), path)
    return path


def _table(cols: dict[str, Any]) -> pa.Table:
    return build_table(cols, META)


def case_wrong_version(p: Path) -> Path:
    obj = json.loads(META.to_json())
    obj["version"] = 2
    return _raw_write(p, _table(full_columns()), json.dumps(obj))


def case_missing_column(p: Path) -> Path:
    return _raw_write(p, _table(full_columns()).drop_columns(["layer"]), META.to_json())


def case_expert_out_of_range(p: Path) -> Path:
    cols = full_columns()
    cols["experts"][7] = [1, MODEL.num_experts]
    return _raw_write(p, _table(cols), META.to_json())


def case_negative_expert(p: Path) -> Path:
    cols = full_columns()
    cols["experts"][2] = [-1, 3]
    return _raw_write(p, _table(cols), META.to_json())


def case_duplicated_expert(p: Path) -> Path:
    cols = full_columns()
    cols["experts"][5] = [4, 4]
    return _raw_write(p, _table(cols), META.to_json())


def case_experts_length(p: Path) -> Path:
    cols = full_columns()
    ex = [list(map(int, r)) for r in cols["experts"]]
    ex[9] = [0, 1, 2]
    cols["experts"] = ex
    return _raw_write(p, _table(cols), META.to_json())


def case_nonfinite_weights(p: Path) -> Path:
    cols = full_columns()
    cols["weights"][4, 1] = np.nan
    return _raw_write(p, _table(cols), META.to_json())


def case_nonfinite_logits(p: Path) -> Path:
    cols = full_columns()
    cols["logits"][11, 3] = np.inf
    return _raw_write(p, _table(cols), META.to_json())


def case_nonfinite_lookahead(p: Path) -> Path:
    cols = full_columns()
    cols["lookahead_logits"][6, 0] = -np.inf
    return _raw_write(p, _table(cols), META.to_json())


def _reorder(cols: dict[str, Any], order: np.ndarray) -> dict[str, Any]:
    out = {k: (v[order] if k not in ("embedding", "embedding_rows") else v) for k, v in cols.items()}
    out.pop("embedding")
    out.pop("embedding_rows")
    return out


def case_rows_out_of_order(p: Path) -> Path:
    cols = full_columns()
    order = np.arange(15)
    order[[3, 4, 5, 6, 7, 8]] = [6, 7, 8, 3, 4, 5]  # token 1 and token 2 of request 0 swapped
    return _raw_write(p, _table(_reorder(cols, order)), META.to_json())


def case_missing_layer(p: Path) -> Path:
    cols = full_columns()
    keep = np.delete(np.arange(15), 10)  # request 1 token 0 loses layer 1
    return _raw_write(p, _table(_reorder(cols, keep)), META.to_json())


def case_missing_last_layers(p: Path) -> Path:
    cols = full_columns()
    keep = np.arange(14)  # the last token stops at layer 1
    return _raw_write(p, _table(_reorder(cols, keep)), META.to_json())


# (case, row or None, column or None, words in the message); token gaps are allowed, so in
# case_rows_out_of_order the offence is token 1 after token 2 (row 6)
CASES = [
    (case_wrong_version, None, None, "version 2"),
    (case_missing_column, None, "layer", "missing required column"),
    (case_expert_out_of_range, 7, "experts", "outside 0..5"),
    (case_negative_expert, 2, "experts", "outside 0..5"),
    (case_duplicated_expert, 5, "experts", "duplicated expert"),
    (case_experts_length, 9, "experts", "3 entries, expected 2"),
    (case_nonfinite_weights, 4, "weights", "non-finite"),
    (case_nonfinite_logits, 11, "logits", "non-finite"),
    (case_nonfinite_lookahead, 6, "lookahead_logits", "non-finite"),
    (case_rows_out_of_order, 6, "token_idx", "out of order"),
    (case_missing_layer, 10, "layer", "missing layers"),
    (case_missing_last_layers, 13, "layer", "missing layers"),
]


@pytest.mark.parametrize(("make", "row", "column", "words"), CASES, ids=[c[0].__name__ for c in CASES])
def test_validation_error_names_file_row_column(tmp_path: Path, make: Any, row: int | None,
                                                column: str | None, words: str) -> None:
    path = make(tmp_path / "bad.parquet")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert words in msg
    if row is not None:
        assert f"row {row}" in msg and info.value.row == row
    if column is not None:
        assert f"column {column!r}" in msg
    # the streaming reader raises the same error with batches that split tokens
    with pytest.raises(TraceError) as info2:
        for _ in iter_batches(path, batch_rows=2):
            pass
    assert str(info2.value) == msg


@pytest.mark.parametrize(("make", "row", "column", "words"), CASES, ids=[c[0].__name__ for c in CASES])
def test_validation_error_from_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any,
                                   row: int | None, column: str | None, words: str) -> None:
    path = make(tmp_path / "bad.parquet")
    # stats reads (and so checks) the required columns and lookahead_logits only
    cmds = ["inspect"] + (["stats"] if column not in ("weights", "logits") else [])
    for cmd in cmds:
        assert main(["trace", cmd, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("simctl: error: ")
        assert "Traceback" not in err and words in err and str(path) in err


def test_not_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("hello")
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"a": [1]}), plain)
    for path, words in ((junk, "not a Parquet file"), (plain, "not a moe-trace file"),
                        (tmp_path / "nope.parquet", "no such file"), (tmp_path, "directory")):
        with pytest.raises(TraceError, match=words):
            read_trace(path)
        assert main(["trace", "inspect", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err


def test_write_is_validated_and_atomic(tmp_path: Path) -> None:
    cols = full_columns()
    cols["experts"][3] = [2, 2]
    out = tmp_path / "sub" / "t.parquet"
    with pytest.raises(TraceError, match=r"row 3, column 'experts'"):
        write_trace(out, cols, META)
    assert not out.exists()
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))
    # an existing file is not touched by a failed write
    good = write_trace(out, full_columns(), META)
    before = good.read_bytes()
    with pytest.raises(TraceError):
        write_trace(out, cols, META)
    assert out.read_bytes() == before


def test_error_across_batch_boundary_names_global_row(tmp_path: Path) -> None:
    rows = 3 * 40
    cols: dict[str, Any] = {
        "request_id": np.zeros(rows, dtype=np.int32),
        "token_idx": np.repeat(np.arange(40), 3).astype(np.int32),
        "phase": np.ones(rows, dtype=np.int8),
        "layer": np.tile(np.arange(3), 40).astype(np.int16),
        "experts": np.tile([[0, 1]], (rows, 1)).astype(np.int16),
    }
    path = write_trace(tmp_path / "t.parquet", cols, META)
    table = pq.read_table(path)
    bad = table.slice(0, 64).to_pylist() + table.slice(65).to_pylist()  # drop row 64
    tbl = pa.Table.from_pylist(bad, schema=table.schema)
    pq.write_table(tbl, path)
    with pytest.raises(TraceError, match=r"row 64, column 'layer': missing layers"):
        for _ in iter_batches(path, batch_rows=16):
            pass
