"""Importers of engine captures (vLLM response files, SGLang responses, llama.cpp's
``layer,expert`` CSV) and the CSV/JSONL options (``--map``, ``--drop-incomplete``,
``--weights``), each on a tiny fixture of ``tests/data/traces`` with the exact expected rows."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import DECODE, PREFILL, read_trace
from moesim.traces.importers.registry import (
    SourceError,
    import_csv,
    import_jsonl,
    import_llamacpp,
    import_sglang,
    import_trace,
    import_vllm,
    model_info,
    parse_column_map,
)

DATA = Path(__file__).resolve().parent / "data" / "traces"
TINY = model_info("tiny", num_layers=2, num_experts=4, top_k=2)
P, D = PREFILL, DECODE


def _tokens(cols: dict[str, np.ndarray]) -> list[tuple[int, int, int, list[list[int]]]]:
    """(request, token, phase, [experts of layer 0, of layer 1]) per token."""
    ex = cols["experts"].reshape(-1, 2, 2)
    return [(int(r), int(t), int(p), ex[i].tolist())
            for i, (r, t, p) in enumerate(zip(cols["request_id"][::2], cols["token_idx"][::2], cols["phase"][::2],
                                              strict=True))]


def test_llamacpp_fixture() -> None:
    cols, meta = import_llamacpp(DATA / "llamacpp-moe-trace.csv", model=TINY)
    # one micro-batch of 3 prompt tokens, then two 1-token micro-batches (decode)
    assert _tokens(cols) == [
        (0, 0, P, [[1, 2], [0, 3]]), (0, 1, P, [[2, 1], [3, 0]]), (0, 2, P, [[2, 3], [1, 0]]),
        (0, 3, D, [[0, 1], [2, 3]]), (0, 4, D, [[3, 0], [1, 2]]),
    ]
    assert meta.source["importer"] == "llamacpp" and meta.source["layers"] == "block indices 1 2 renumbered 0..1"
    cols2, _ = import_llamacpp(DATA / "llamacpp-moe-trace.csv", model=TINY, request_lengths=[(2, 1), (1, 1)])
    assert [(r, t, p) for r, t, p, _ in _tokens(cols2)] == [(0, 0, P), (0, 1, P), (0, 2, D), (1, 0, P), (1, 1, D)]


def test_vllm_response_fixture(tmp_path: Path) -> None:
    out, meta, rows = import_trace("vllm", DATA / "vllm-responses.jsonl", tmp_path / "v.parquet", model=TINY)
    tr = read_trace(out)
    cols = tr.columns()
    # response 0's two choices are two requests sharing its prompt; response 1 is the third
    assert _tokens(cols) == [
        (0, 0, P, [[1, 2], [0, 3]]), (0, 1, P, [[2, 1], [3, 0]]), (0, 2, D, [[2, 3], [1, 0]]),
        (1, 0, P, [[1, 2], [0, 3]]), (1, 1, P, [[2, 1], [3, 0]]), (1, 2, D, [[0, 1], [2, 3]]),
        (1, 3, D, [[3, 0], [1, 2]]),
        (2, 0, P, [[3, 2], [1, 0]]), (2, 1, D, [[1, 0], [2, 3]]),
    ]
    assert rows == 18 and meta.source["requests"] == 3 and tr.weights is None
    with pytest.raises(MoesimError, match="carry their own request boundaries"):
        import_vllm(DATA / "vllm-responses.jsonl", model=TINY, request_lengths=[(1, 1)])


def test_sglang_fixture() -> None:
    cols, meta = import_sglang(DATA / "sglang-responses.jsonl", model=TINY)
    # /generate: 3 prompt + 2 completion tokens, 4 routed (the last sampled token never runs);
    # the completion: 1 prompt token, 2 routed
    assert _tokens(cols) == [
        (0, 0, P, [[1, 2], [0, 3]]), (0, 1, P, [[2, 1], [3, 0]]), (0, 2, P, [[2, 3], [1, 0]]),
        (0, 3, D, [[0, 1], [2, 3]]),
        (1, 0, P, [[3, 0], [1, 2]]), (1, 1, D, [[0, 2], [3, 1]]),
    ]
    assert meta.source == {**meta.source, "importer": "sglang", "requests": 2}


def test_sglang_token_count_checked(tmp_path: Path) -> None:
    ids = np.zeros((2, 2, 2), dtype="<i4")
    ids[:, :, 1] = 1
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"meta_info": {"prompt_tokens": 3, "completion_tokens": 4,
                                             "routed_experts": base64.b64encode(ids.tobytes()).decode()}}))
    with pytest.raises(SourceError, match=r"line 1, field 'meta_info.routed_experts': holds 2 tokens, "
                                          r"expected prompt \+ completion - 1 = 6"):
        import_sglang(src, model=TINY)


def test_map_and_drop_incomplete(tmp_path: Path) -> None:
    src = DATA / "mapped.csv"
    mapping = "request_id=req,token_idx=pos,layer=layer_idx,experts=topk_ids,weights=topk_weights"
    with pytest.raises(SourceError, match="unknown column"):
        import_csv(src, model=TINY)
    with pytest.raises(SourceError, match=r"line 6, field 'layer_idx': request 0, token 2 has 1 of 2 layers"):
        import_csv(src, model=TINY, column_map=parse_column_map(mapping))
    out, meta, rows = import_trace("csv", src, tmp_path / "m.parquet", model=TINY, column_map=mapping,
                                   drop_incomplete=True)
    tr = read_trace(out)
    assert rows == 4 and tr.token_idx.tolist() == [0, 0, 1, 1] and tr.experts.tolist() == [[1, 2], [0, 3], [2, 1], [3, 0]]
    assert meta.source["dropped_tokens"] == 1 and meta.source["weights"] == "renormalized"
    assert meta.source["map"]["experts"] == "topk_ids"


def test_drop_incomplete_renumbers_a_middle_token(tmp_path: Path) -> None:
    src = tmp_path / "r.jsonl"
    recs = [{"request_id": 0, "token_idx": t, "layer": lay, "experts": [t % 4, (t + 1) % 4]}
            for t in range(3) for lay in range(2) if (t, lay) != (1, 1)]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cols, meta = import_jsonl(src, model=TINY, drop_incomplete=True)
    assert cols["token_idx"].tolist() == [0, 0, 1, 1] and cols["experts"][2].tolist() == [2, 3]
    assert meta.source["dropped_tokens"] == 1


@pytest.mark.parametrize(("weights", "declared", "kind"), [
    ("0.5 0.3", "auto", "softmax"), ("0.6 0.4", "auto", "renormalized"), ("0.6 0.4", "softmax", "softmax"),
    ("2.5 1.5", "scores", "scores"),
])
def test_weight_semantics_recorded(tmp_path: Path, weights: str, declared: str, kind: str) -> None:
    src = tmp_path / "w.csv"
    src.write_text(f"request_id,token_idx,layer,experts,weights\n0,0,0,1 2,{weights}\n0,0,1,0 3,{weights}\n")
    _, meta = import_csv(src, model=TINY, weights=declared)
    assert meta.source["weights"] == kind


@pytest.mark.parametrize(("weights", "declared", "words"), [
    ("2.5 1.5", "auto", "sum to 4 > 1"), ("0.5 0.3", "renormalized", "sum to 0.8, not 1"),
    ("0.9 0.3", "softmax", "sum to 1.2 > 1"), ("0.5 -0.1", "scores", "must be >= 0"),
])
def test_weight_semantics_checked(tmp_path: Path, weights: str, declared: str, words: str) -> None:
    src = tmp_path / "w.csv"
    src.write_text(f"request_id,token_idx,layer,experts,weights\n0,0,0,1 2,0.5 0.5\n0,0,1,0 3,{weights}\n")
    with pytest.raises(SourceError) as info:
        import_csv(src, model=TINY, weights=declared)
    assert f"{src}, line 3, field 'weights': " in str(info.value) and words in str(info.value)


def test_parse_column_map() -> None:
    assert parse_column_map("experts=topk_ids, weights=topk_weights") == {"topk_ids": "experts",
                                                                           "topk_weights": "weights"}
    assert parse_column_map({"experts": "ids"}) == {"ids": "experts"}
    with pytest.raises(MoesimError, match="unknown field 'expert' \\(did you mean 'experts'\\?\\)"):
        parse_column_map("expert=topk_ids")
    with pytest.raises(MoesimError, match="expected FIELD=COLUMN"):
        parse_column_map("experts")
    with pytest.raises(MoesimError, match="field 'experts' is mapped twice"):
        parse_column_map("experts=a,experts=b")
    with pytest.raises(MoesimError, match="column 'a' is mapped to both 'experts' and 'weights'"):
        parse_column_map("experts=a,weights=a")
