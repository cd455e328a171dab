"""The bad-input corpus, trace files: every way a moe-trace file can be wrong that `simctl trace
inspect` and `simctl run` must name in one line (file, row, column), built from the bundled
sample (see ``tests/bad_input.py`` for what each case asserts)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.bad_input import (
    Case,
    Corpus,
    at,
    check,
    drop_column,
    mutate,
    renumber,
    rows,
    set_column,
    small_table,
    with_meta,
    write_trace,
)

CORPUS = Corpus()
trace_case = CORPUS.trace_case

trace_case("not-parquet", lambda p: p.write_text("hello"), "Parquet")
trace_case("no-meta", lambda p: write_trace(p, small_table(), None), "moe_trace")
trace_case("meta-not-json", with_meta(lambda m: b"{nope"), "JSON")
trace_case("meta-version", with_meta(lambda m: m.update(version=2)), "version")
trace_case("meta-no-model", with_meta(lambda m: m.pop("model")), "model")
trace_case("meta-topk-gt-experts", with_meta(lambda m: m["model"].update(top_k=100)), "top_k")
trace_case("meta-layers-zero", with_meta(lambda m: m["model"].update(num_layers=0)), "num_layers")
trace_case("meta-layers-string", with_meta(lambda m: m["model"].update(num_layers="8")), "num_layers")
trace_case("missing-experts", drop_column("experts"), "experts")
trace_case("missing-layer", drop_column("layer"), "layer")
trace_case("experts-strings", mutate("experts", lambda v: [[str(x) for x in r] for r in v], pa.list_(pa.string())),
           "experts", "string")
trace_case("experts-floats", mutate("experts", lambda v: [[x + 0.5 for x in r] for r in v], pa.list_(pa.float32())),
           "experts", "float")
trace_case("experts-nested", mutate("experts", lambda v: [[r] for r in v], pa.list_(pa.list_(pa.int16()))),
           "experts")
trace_case("experts-scalar", mutate("experts", lambda v: [r[0] for r in v], pa.int16()), "experts")
trace_case("experts-out-of-range", mutate("experts", lambda v: at(v, 9, [64, 1, 2, 3, 4, 5])), "experts", "row 9")
trace_case("experts-short", mutate("experts", lambda v: at(v, 3, [1, 2])), "experts", "row 3")
trace_case("experts-duplicate", mutate("experts", lambda v: at(v, 5, [1, 1, 2, 3, 4, 5])), "experts", "row 5")
trace_case("experts-null", mutate("experts", lambda v: at(v, 7, None)), "experts", "row 7")
trace_case("request-strings", mutate("request_id", lambda v: [f"r{x}" for x in v], pa.string()), "request_id")
trace_case("request-floats", mutate("request_id", lambda v: [x + 0.5 for x in v], pa.float64()), "request_id")
trace_case("token-negative", renumber("token_idx", lambda x: x - 1), "token_idx")
def skip_token(t: pa.Table) -> pa.Table:
    """Request 0 jumps from token 1 to token 3 (rows 16 on of that request)."""
    tok, req = t.column("token_idx").to_pylist(), t.column("request_id").to_pylist()
    new = [x + (1 if i >= 16 and r == 0 else 0) for i, (x, r) in enumerate(zip(tok, req, strict=True))]
    return set_column(t, "token_idx", pa.array(new, pa.int32()))


trace_case("token-gap", rows(skip_token), "token_idx", "row 16")
trace_case("request-gap", renumber("request_id", lambda x: 2 * x), "request_id", "row 512")
trace_case("layer-out-of-range", mutate("layer", lambda v: at(v, 4, 9), pa.int16()), "layer", "row 4")
trace_case("layer-string", mutate("layer", lambda v: [str(x) for x in v], pa.string()), "layer")
trace_case("rows-out-of-order", rows(lambda t: pa.concat_tables([t.slice(8, 8), t.slice(0, 8), t.slice(16)])),
           "row 8")
trace_case("truncated-token", rows(lambda t: t.slice(0, 1020)), "missing layers")
trace_case("phase-unknown", mutate("phase", lambda v: at(v, 2, "prefil"), pa.string()), "phase", "row 2")
trace_case("phase-int", mutate("phase", lambda v: [1 for _ in v], pa.int8()), "phase")
trace_case("weights-strings", mutate("weights", lambda v: [[str(x) for x in r] for r in v], pa.list_(pa.string())),
           "weights")
trace_case("weights-negative", mutate("weights", lambda v: at(v, 11, [-0.5, 0.1, 0.1, 0.1, 0.1, 0.1])),
           "weights", "row 11")
trace_case("weights-nan", mutate("weights", lambda v: at(v, 12, [float("nan")] * 6)), "weights", "row 12")
trace_case("token-id-strings", mutate("token_id", lambda v: [str(x) for x in v], pa.string()), "token_id")
trace_case("unknown-column", rows(lambda t: t.append_column("expertz", pa.array([0] * t.num_rows))), "expertz")
trace_case("empty", rows(lambda t: t.slice(0, 0)), "no rows")


@pytest.mark.parametrize("c", CORPUS.cases, ids=[c.id for c in CORPUS.cases])
def test_bad_trace(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    check(c, tmp_path, monkeypatch, capsys)
