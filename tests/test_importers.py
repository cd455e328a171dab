"""Importers: generic CSV/JSONL and vLLM on small fixtures, every malformed input as a one-line
error naming file, line and field, and the shipped FLAME sample against its CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moesim.sim.config.catalog import CatalogError
from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import DECODE, PREFILL, read_trace
from moesim.traces.importers.registry import (
    SourceError,
    import_csv,
    import_flame,
    import_jsonl,
    import_trace,
    import_vllm,
    model_info,
    parse_request_lengths,
)
from tests.util import assert_same_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"
SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
FLAME_CSV = ROOT.parent / "shared" / "data" / "flame-moe-290m" / "routing.csv"
TINY = model_info("tiny", num_layers=2, num_experts=4, top_k=2)

# the fixture sorted by (request, token, layer): request 1's two rows come in reverse order
EXPECTED = {
    "request_id": [0, 0, 0, 0, 0, 0, 1, 1],
    "token_idx": [0, 0, 1, 1, 2, 2, 0, 0],
    "layer": [0, 1, 0, 1, 0, 1, 0, 1],
    "phase": [PREFILL] * 4 + [DECODE] * 4,
    "experts": [[1, 2], [0, 3], [2, 1], [3, 0], [2, 3], [1, 0], [3, 2], [1, 0]],
    "weights": [[.5, .3], [.6, .2], [.4, .35], [.5, .25], [.55, .15], [.45, .4], [.45, .3], [.7, .1]],
    "token_id": [11, 11, 12, 12, 13, 13, 21, 21],
}


def _check_expected(path: Path) -> None:
    tr = read_trace(path)
    for name, want in EXPECTED.items():
        got = getattr(tr, name)
        if name == "weights":
            np.testing.assert_allclose(got, np.asarray(want, dtype=np.float32))
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_generic_fixture(tmp_path: Path, fmt: str) -> None:
    out, meta, rows = import_trace(fmt, DATA / f"tiny.{fmt}", tmp_path / "t.parquet", model=TINY)
    assert rows == 8 and meta.source["importer"] == fmt and meta.source["file"] == f"tiny.{fmt}"
    _check_expected(out)


def test_csv_without_optional_columns_is_decode(tmp_path: Path) -> None:
    src = tmp_path / "min.csv"
    src.write_text("request_id,token_idx,layer,experts\n0,0,0,1 2\n0,0,1,3 0\n\n")
    cols, _ = import_csv(src, model=TINY)
    assert set(cols) == {"request_id", "token_idx", "phase", "layer", "experts"}
    assert (cols["phase"] == DECODE).all()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


HEAD = "request_id,token_idx,layer,experts,weights,phase\n"
OK0 = "0,0,0,1 2,0.5 0.3,decode\n"
OK1 = "0,0,1,0 3,0.6 0.2,decode\n"

# (csv text, line, field, words)
CSV_ERRORS = [
    (HEAD + "x,0,0,1 2,0.5 0.3,decode\n", 2, "request_id", "expected an integer"),
    (HEAD + OK0 + "0,0,1,1 2 3,0.5 0.3,decode\n", 3, "experts", "3 entries, expected 2"),
    (HEAD + OK0 + "0,0,1,1 4,0.5 0.3,decode\n", 3, "experts", "outside 0..3"),
    (HEAD + OK0 + "0,0,1,1 1.5,0.5 0.3,decode\n", 3, "experts", "not an integer"),
    (HEAD + OK0 + "0,0,1,3 3,0.5 0.3,decode\n", 3, "experts", "duplicated expert"),
    (HEAD + OK0 + "0,0,1,0 3,0.5 nan,decode\n", 3, "weights", "non-finite"),
    (HEAD + OK0 + "0,0,1,0 3,0.5 abc,decode\n", 3, "weights", "not a number"),
    (HEAD + OK0 + "0,0,1,0 3,0.5,decode\n", 3, "weights", "1 entries, expected 2"),
    (HEAD + OK0 + "0,0,1,0 3,0.5 0.3,generate\n", 3, "phase", "expected 'prefill' or 'decode'"),
    (HEAD + OK0 + "0,0,2,0 3,0.5 0.3,decode\n", 3, "layer", "outside 0..1"),
    (HEAD + OK0 + "0,-1,1,0 3,0.5 0.3,decode\n", 3, "token_idx", "must be in"),
    (HEAD + OK0 + OK1 + OK0, 4, "layer", "second record for request 0, token 0, layer 0 (first at line 2)"),
    (HEAD + OK0 + OK1 + "0,1,1,0 3,0.5 0.3,decode\n", 4, "layer", "has 1 of 2 layers (missing 0)"),
    (HEAD + OK0 + "0,0,1,0 3,0.5 0.3,prefill\n", 3, "phase", "differs between layers"),
    (HEAD + OK0 + OK1 + "0,1,0,1 2,.5 .3,prefill\n0,1,1,1 2,.5 .3,prefill\n", 4, "phase", "prefill token after a decode"),
    ("request_id,token_idx,layer,experts,colour\n0,0,0,1 2,red\n", 1, "colour", "unknown column"),
    ("request_id,token_idx,experts\n0,0,1 2\n", 1, "layer", "missing required column"),
    ("request_id,token_idx,layer,layer,experts\n", 1, "layer", "appears twice"),
    (HEAD + "0,0,0,1 2\n", 2, None, "has 4 fields, the header has 6"),
    ("", 1, None, "empty file"),
    (HEAD, None, None, "no records"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), CSV_ERRORS)
def test_csv_errors(tmp_path: Path, text: str, line: int | None, field: str | None, words: str) -> None:
    src = _write(tmp_path, "bad.csv", text)
    with pytest.raises(SourceError) as info:
        import_csv(src, model=TINY)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(src)) and words in msg
    if line is not None:
        assert f"line {line}" in msg
    if field is not None:
        assert f"field {field!r}" in msg


GOOD = {"request_id": 0, "token_idx": 0, "layer": 0, "experts": [1, 2]}

JSONL_ERRORS: list[tuple[str, int, str | None, str]] = [
    (json.dumps(GOOD) + "\n{not json\n", 2, None, "invalid JSON"),
    ("[1, 2]\n", 1, None, "expected a JSON object"),
    (json.dumps({**GOOD, "experts": "1 2 3"}) + "\n", 1, "experts", "3 entries"),
    (json.dumps({**GOOD, "experts": 5}) + "\n", 1, "experts", "expected a list"),
    (json.dumps({**GOOD, "experts": [1, True]}) + "\n", 1, "experts", "not an integer"),
    (json.dumps({**GOOD, "layer": 1.5}) + "\n", 1, "layer", "expected an integer"),
    (json.dumps({**GOOD, "request_id": True}) + "\n", 1, "request_id", "expected an integer"),
    (json.dumps({**GOOD, "extra": 1}) + "\n", 1, "extra", "unknown column"),
    (json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "layer": 1, "weights": [0.1, 0.2]}) + "\n", 2, "weights",
     "present here but absent in the first record"),
    (json.dumps({"request_id": 0, "token_idx": 0, "layer": 0}) + "\n", 1, "experts", "missing required"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), JSONL_ERRORS)
def test_jsonl_errors(tmp_path: Path, text: str, line: int, field: str | None, words: str) -> None:
    src = _write(tmp_path, "bad.jsonl", text)
    with pytest.raises(SourceError) as info:
        import_jsonl(src, model=TINY)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(src)) and words in msg and f"line {line}" in msg
    if field is not None:
        assert f"field {field!r}" in msg


# --------------------------------------------------------------------------------------------
# vLLM


def _capture(tmp_path: Path, lengths: list[tuple[int, int]], *, layers: int = 2, k: int = 2, E: int = 4,
             seed: int = 0) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = sum(p + d for p, d in lengths)
    arr = np.stack([np.stack([rng.permutation(E)[:k] for _ in range(layers)]) for _ in range(tokens)])
    src = tmp_path / "routed.npy"
    np.save(src, arr.astype(np.int16))
    return src, arr


def test_vllm_with_sidecar(tmp_path: Path) -> None:
    lengths = [(3, 2), (1, 4), (2, 0)]
    src, arr = _capture(tmp_path, lengths)
    side = tmp_path / "routed.json"
    side.write_text(json.dumps({"requests": [{"prompt_tokens": p, "output_tokens": d} for p, d in lengths]}))
    out, meta, rows = import_trace("vllm", src, tmp_path / "v.parquet", model=TINY, sidecar=side)
    tr = read_trace(out)
    assert rows == 12 * 2 and meta.source["sidecar"] == "routed.json" and tr.weights is None
    np.testing.assert_array_equal(tr.experts, arr.reshape(-1, 2))
    np.testing.assert_array_equal(tr.request_id[::2], [0] * 5 + [1] * 5 + [2] * 2)
    np.testing.assert_array_equal(tr.token_idx[::2], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1])
    np.testing.assert_array_equal(tr.phase[::2], [0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0])
    # the same from the flag, and from the sidecar found beside the array
    cols_flag, _ = import_vllm(src, model=TINY, request_lengths=parse_request_lengths("3:2, 1:4,2:0"))
    cols_auto, _ = import_vllm(src, model=TINY)
    for name in ("request_id", "token_idx", "phase", "layer", "experts"):
        np.testing.assert_array_equal(cols_flag[name], tr.columns()[name])
        np.testing.assert_array_equal(cols_auto[name], tr.columns()[name])


def test_vllm_errors(tmp_path: Path) -> None:
    src, arr = _capture(tmp_path, [(2, 2)])
    with pytest.raises(MoesimError, match="no request boundaries"):
        import_vllm(src, model=TINY)
    with pytest.raises(MoesimError, match="the requests hold 5 tokens, the array routed.npy has 4"):
        import_vllm(src, model=TINY, request_lengths=[(2, 3)])
    with pytest.raises(MoesimError, match="is not PROMPT:DECODE"):
        parse_request_lengths("2:2,3")
    with pytest.raises(SourceError, match="array has 2 layers, model 'tiny' has 3"):
        import_vllm(src, model=model_info("tiny", num_layers=3, num_experts=4, top_k=2), request_lengths=[(2, 2)])
    with pytest.raises(SourceError, match="array has top_k 2, model 'tiny' has 1"):
        import_vllm(src, model=model_info("tiny", num_layers=2, num_experts=4, top_k=1), request_lengths=[(2, 2)])
    bad = arr.copy()
    bad[3, 1, 0] = 9
    np.save(src, bad.astype(np.int16))
    with pytest.raises(SourceError, match=r"token 3, layer 1, field 'experts': expert id 9 outside 0..3"):
        import_vllm(src, model=TINY, request_lengths=[(2, 2)])
    bad = arr.copy()
    bad[2, 0] = [1, 1]
    np.save(src, bad.astype(np.int16))
    with pytest.raises(SourceError, match=r"token 2, layer 0, field 'experts': duplicated expert"):
        import_vllm(src, model=TINY, request_lengths=[(2, 2)])
    np.save(src, arr.astype(np.float32))
    with pytest.raises(SourceError, match="expected integers"):
        import_vllm(src, model=TINY, request_lengths=[(2, 2)])
    np.save(src, arr.reshape(4, 4))
    with pytest.raises(SourceError, match=r"expected \[tokens, layers, top_k\]"):
        import_vllm(src, model=TINY, request_lengths=[(2, 2)])
    src.write_text("not numpy")
    with pytest.raises(SourceError, match="not a numpy .npy array"):
        import_vllm(src, model=TINY, request_lengths=[(2, 2)])
    side = tmp_path / "side.json"
    for text, words in (("{", "invalid JSON"), ('{"requests": [{"prompt_tokens": -1, "output_tokens": 2}]}',
                                                "requests[0].prompt_tokens"),
                        ('{"requests": [{"prompt_tokens": 1, "output": 2}]}', "requests[0].output"),
                        ('{"reqs": []}', "requests"), ('{"requests": []}', "no requests")):
        side.write_text(text)
        with pytest.raises(SourceError, match=words.replace("[", r"\[").replace("]", r"\]")):
            import_vllm(_capture(tmp_path, [(2, 2)])[0], model=TINY, sidecar=side)


def test_model_info() -> None:
    m = model_info("mixtral-8x7b")
    assert (m.num_layers, m.num_experts, m.top_k) == (32, 8, 2)
    assert model_info("mixtral-8x7b", top_k=1).top_k == 1
    with pytest.raises(CatalogError, match="did you mean 'mixtral-8x7b'.*--num-layers"):
        model_info("mixtral-8x7")
    with pytest.raises(CatalogError, match="top_k"):
        model_info("tiny", num_layers=2, num_experts=2, top_k=3)


# --------------------------------------------------------------------------------------------
# FLAME sample


def _read_flame_csv(path: Path) -> dict[str, Any]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    return {
        "request_id": [int(r["request_id"]) for r in rows],
        "token_idx": [int(r["token_idx"]) for r in rows],
        "layer": [int(r["layer"]) - 2 for r in rows],
        "token_id": [int(r["token_id"]) for r in rows],
        "experts": [[int(x) for x in r["expert_ids"].split()] for r in rows],
        "weights": np.asarray([[float(x) for x in r["probs"].split()] for r in rows], dtype=np.float32),
    }


def test_flame_sample_is_shipped_and_valid() -> None:
    tr = read_trace(SAMPLE)
    m = tr.model
    assert (m.name, m.num_layers, m.num_experts, m.top_k, m.num_shared_experts) == ("flame-moe-290m", 8, 64, 6, 2)
    assert tr.num_rows == 16_384 and (tr.phase == DECODE).all()
    src = tr.meta.source
    assert src["license"] == "Apache-2.0" and src["checkpoint"] == 5473 and "FLAME" in src["dataset"]
    assert (SAMPLE.parent / "NOTICE.md").read_text().startswith("# FLAME-MoE-290M routing sample")


@pytest.mark.skipif(not FLAME_CSV.exists(), reason="needs ../shared/data/flame-moe-290m")
def test_flame_sample_equals_its_csv(tmp_path: Path) -> None:
    want = _read_flame_csv(FLAME_CSV)
    tr = read_trace(SAMPLE)
    for name, values in want.items():
        np.testing.assert_array_equal(getattr(tr, name), values, err_msg=name)
    # the import reproduces the shipped sample (content and metadata: the Parquet bytes also
    # carry the writer's version, which may differ from the one that wrote the sample)
    out, _, _ = import_trace("flame", FLAME_CSV, tmp_path / "flame.parquet")
    assert_same_trace(read_trace(out), tr)


def test_flame_importer_on_fixture(tmp_path: Path) -> None:
    src = _write(tmp_path, "routing.csv",
                 "request_id,token_idx,layer,token_id,expert_ids,probs\n"
                 + "".join(f"0,0,{lay},7,{lay + 50} 1 2 3 4 5,0.1 0.09 0.08 0.07 0.06 0.05\n" for lay in range(2, 10)))
    cols, meta = import_flame(src)
    assert cols["layer"].tolist() == list(range(8)) and cols["experts"][:, 0].tolist() == list(range(52, 60))
    assert meta.model.name == "flame-moe-290m" and len(meta.source["sha256"]) == 64
    bad = _write(tmp_path, "bad.csv", "request_id,token_idx,layer,token_id,expert_ids,probs\n"
                 "0,0,10,7,0 1 2 3 4 5,0.1 0.09 0.08 0.07 0.06 0.05\n")
    with pytest.raises(SourceError, match=r"line 2, field 'layer': layer 10 outside 2..9"):
        import_flame(bad)
