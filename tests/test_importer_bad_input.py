"""Bad input to ``simctl trace import``: every case is exit 2 with one stderr line naming the
culprit (file, line or index, field), no traceback, and nothing written (no output, no temp
file). Then hypothesis mutates valid small inputs of every format: each mutant imports or
raises the one-line :class:`MoesimError`, never anything else."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moesim.sim.cli.main import main
from moesim.sim.core.errors import MoesimError
from moesim.traces.importers.registry import (
    import_csv,
    import_flame,
    import_jsonl,
    import_llamacpp,
    import_sglang,
    import_vllm,
    model_info,
)

DATA = Path(__file__).resolve().parent / "data" / "traces"
TINY = ["--model", "tiny", "--num-layers", "2", "--num-experts", "4", "--top-k", "2"]
TINY_INFO = model_info("tiny", num_layers=2, num_experts=4, top_k=2)

H = "request_id,token_idx,layer,experts\n"
A = "0,0,0,1 2\n0,0,1,0 3\n"  # request 0, token 0: complete
HW = "request_id,token_idx,layer,experts,weights\n"
FLAME_H = "request_id,token_idx,layer,token_id,expert_ids,probs\n"
SIX = "0 1 2 3 4 5,0.1 0.09 0.08 0.07 0.06 0.05"


def _j(**kw: Any) -> str:
    return json.dumps({"request_id": 0, "token_idx": 0, "layer": 0, "experts": [1, 2], **kw}) + "\n"


def _b64(ids: Any) -> str:
    return base64.b64encode(np.asarray(ids, dtype="<i4").tobytes()).decode()


def _sg(n_tokens: int, p: int = 1, d: int | None = None, **meta: Any) -> str:
    ids = np.tile(np.array([[0, 1], [2, 3]]), (n_tokens, 1, 1))
    info = {"prompt_tokens": p, "completion_tokens": n_tokens - p + 1 if d is None else d, "routed_experts": _b64(ids)}
    return json.dumps({"meta_info": {**info, **meta}}) + "\n"


def _vl(prompt: Any, gen: Any) -> str:
    return json.dumps({"prompt_routed_experts": prompt, "choices": [{"routed_experts": gen}]}) + "\n"


GOOD_TOK = [[0, 1], [2, 3]]
LC = "layer,expert\n"

# (format, file name, content, extra args, words expected in the one line)
CASES: list[tuple[str, str, str | bytes, list[str], list[str]]] = [
    # --- CSV: integers
    ("csv", "a.csv", H + "99999999999999999999,0,0,1 2\n", [], ["line 2, field 'request_id'", "too large"]),
    ("csv", "a.csv", H + A + "0,2147483648,0,1 2\n", [], ["line 4, field 'token_idx'", "0..2**31-1"]),
    ("csv", "a.csv", H + "0,0,0,1 40000\n", [], ["line 2, field 'experts'", "outside 0..3"]),
    ("csv", "a.csv", H + "0,0,0,1 1000000000000000000000000\n", [], ["line 2, field 'experts'", "too large"]),
    ("csv", "a.csv", H + "0,0,70000,1 2\n", [], ["line 2, field 'layer'", "outside 0..1"]),
    ("csv", "a.csv", H + "req-1,0,0,1 2\n", [], ["line 2, field 'request_id'", "expected an integer, got 'req-1'"]),
    ("csv", "a.csv", H + "0,0,0,a b\n", [], ["line 2, field 'experts'", "'a' is not an integer"]),
    ("csv", "a.csv", H + "0,0,1.0,1 2\n", [], ["line 2, field 'layer'", "expected an integer"]),
    ("csv", "a.csv", H + "0,0,0,1 ٣\n", [], ["line 2, field 'experts'", "is not an integer"]),
    # --- CSV: weights
    ("csv", "a.csv", HW + "0,0,0,1 2,0.5 -0.1\n0,0,1,0 3,0.5 0.1\n", [], ["line 2, field 'weights'", "must be >= 0"]),
    ("csv", "a.csv", HW + "0,0,0,1 2,0.5 inf\n", [], ["line 2, field 'weights'", "non-finite"]),
    ("csv", "a.csv", HW + "0,0,0,1 2,3 4\n0,0,1,0 3,1 1\n", [], ["line 2, field 'weights'", "--weights scores"]),
    ("csv", "a.csv", HW + "0,0,0,1 2,.5 .2\n0,0,1,0 3,.5 .5\n", ["--weights", "renormalized"],
     ["line 2, field 'weights'", "not 1"]),
    ("csv", "a.csv", HW + "0,0,0,1 2,.5 .2\n", ["--weights", "probabilities"], ["--weights 'probabilities'"]),
    ("csv", "a.csv", H + A, ["--weights", "softmax"], ["a.csv: --weights softmax given, but the file has no weights"]),
    # --- CSV: structure
    ("csv", "a.csv", H + A + "0,2,0,1 2\n0,2,1,1 2\n", [], ["line 4, field 'token_idx'", "jumps from token 0 to 2"]),
    ("csv", "a.csv", H + A + "2,0,0,1 2\n2,0,1,1 2\n", [], ["line 4, field 'request_id'", "jump from 0 to 2"]),
    ("csv", "a.csv", H + "0,1,0,1 2\n0,1,1,1 2\n", [], ["line 2, field 'token_idx'", "starts at token 1"]),
    ("csv", "a.csv", H + A + "0,0,1,0 3\n", [], ["line 4, field 'layer'", "second record", "first at line 3"]),
    ("csv", "a.csv", H + A + "0,1,0,1 2\n", [], ["line 4, field 'layer'", "has 1 of 2 layers", "--drop-incomplete"]),
    ("csv", "a.csv", H + "0,0,0,1 2\n", ["--drop-incomplete"], ["every token misses layers"]),
    ("csv", "a.csv", H + "0,0,0,1 2,9\n", [], ["line 2", "has 5 fields, the header has 4"]),
    ("csv", "a.csv", "request_id,token_idx,layer,experts,colour\n", [], ["line 1, field 'colour'", "unknown column"]),
    ("csv", "a.csv", "request_id,token_idx,experts\n", [], ["line 1, field 'layer'", "missing required column"]),
    ("csv", "a.csv", H, [], ["a.csv: no records"]),
    ("csv", "a.csv", "", [], ["line 1", "empty file"]),
    ("csv", "a.csv", (H + "0,0,0,1 2\n").encode() + b"\xff\xfe,0\n", [], ["not UTF-8"]),
    ("csv", "a.csv", H + "0,0,0,1\x002\n", [], ["line 2, field 'experts'", "has 1 entries"]),
    ("csv", "a.csv", "request_id,token_idx,layer,experts,phase\n0,0,0,1 2,generate\n", [],
     ["line 2, field 'phase'", "expected 'prefill' or 'decode'"]),
    # --- --map
    ("csv", "a.csv", "req,token_idx,layer,experts\n", ["--map", "request=req"], ["unknown field 'request'",
                                                                              "did you mean 'request_id'"]),
    ("csv", "a.csv", H + A, ["--map", "experts=topk_ids"], ["line 1, field 'topk_ids'", "missing required column"]),
    ("csv", "a.csv", "ids,token_idx,layer,experts\n", ["--map", "request_id=ids,token_idx=ids"],
     ["column 'ids' is mapped to both"]),
    ("csv", "a.csv", "ids,token_idx,layer,experts\n0,0,0,1 2\n", ["--map", "request_id=ids,experts"],
     ["--map 'experts': expected FIELD=COLUMN"]),
    ("csv", "a.csv", "request_id,ids,token_idx,layer,experts\n", ["--map", "request_id=ids"],
     ["line 1, field 'request_id'", "as does column 'ids'"]),
    ("vllm", "a.npy", b"", ["--map", "experts=x"], ["apply to --from csv and jsonl, not vllm"]),
    ("csv", "a.csv", H + A, ["--request-lengths", "1:0"], ["--request-lengths applies to --from vllm and llamacpp"]),
    # --- JSONL
    ("jsonl", "a.jsonl", _j(request_id=10**30), [], ["line 1, field 'request_id'", "too large"]),
    ("jsonl", "a.jsonl", _j(request_id="req-1"), [], ["line 1, field 'request_id'", "expected an integer"]),
    ("jsonl", "a.jsonl", _j(experts=[1.5, 2]), [], ["line 1, field 'experts'", "not an integer"]),
    ("jsonl", "a.jsonl", _j(experts=[1, None]), [], ["line 1, field 'experts'", "not an integer"]),
    ("jsonl", "a.jsonl", _j(weights=[0.5, -0.5]) + _j(layer=1, weights=[0.5, 0.5]), [],
     ["line 1, field 'weights'", "must be >= 0"]),
    ("jsonl", "a.jsonl", "[" * 100_000 + "\n", [], ["line 1", "invalid JSON"]),
    ("jsonl", "a.jsonl", _j() + _j(layer=1) + _j(), [], ["line 3, field 'layer'", "second record"]),
    ("jsonl", "a.jsonl", _j(topk_ids=[1, 2]), ["--map", "experts=topk_ids"], ["line 1, field 'experts'",
                                                                              "as does column 'topk_ids'"]),
    # --- FLAME
    ("flame", "routing.csv", "request_id,token_idx,layer,token_id,probs\n0,0,2,7,0.1 0.1 0.1 0.1 0.1 0.1\n", [],
     ["line 1, field 'expert_ids'", "missing required column"]),
    ("flame", "routing.csv", FLAME_H + f"0,0,1,7,{SIX}\n", [], ["line 2, field 'layer'", "layer 1 outside 2..9"]),
    ("flame", "routing.csv", FLAME_H + f"0,0,2,7,{SIX}\n", [], ["line 2, field 'layer'", "has 1 of 8 layers"]),
    # --- vLLM
    ("vllm", "r.jsonl", json.dumps({"prompt_routed_experts": [GOOD_TOK]}) + "\n", [],
     ["line 1, field 'routed_experts'", "missing"]),
    ("vllm", "r.jsonl", _vl([GOOD_TOK], [[[0, 1], [2]]]), [], ["line 1, field 'choices[0].routed_experts'", "ragged"]),
    ("vllm", "r.jsonl", _vl([GOOD_TOK], [[[0, 1]]]), [], ["field 'choices[0].routed_experts'", "expected [tokens, 2, 2]"]),
    ("vllm", "r.jsonl", _vl([[[0.5, 1], [2, 3]]], [GOOD_TOK]), [], ["field 'prompt_routed_experts'", "integer"]),
    ("vllm", "r.jsonl", _vl([GOOD_TOK], [GOOD_TOK]) + _vl([GOOD_TOK], [[[0, 1], [2, 9]]]), [],
     ["response 1, token 1, layer 1, field 'experts'", "expert id 9 outside 0..3"]),
    ("vllm", "r.jsonl", _vl([GOOD_TOK], [GOOD_TOK]) + "{oops\n", [], ["line 2", "invalid JSON"]),
    ("vllm", "r.jsonl", "[1, 2]\n", [], ["line 1", "expected a response object, got int"]),
    # --- SGLang
    ("sglang", "s.jsonl", json.dumps({"meta_info": {"prompt_tokens": 1, "completion_tokens": 1,
                                                    "routed_experts": "**"}}) + "\n", [],
     ["line 1, field 'meta_info.routed_experts'", "not valid base64"]),
    ("sglang", "s.jsonl", json.dumps({"meta_info": {"prompt_tokens": 1, "completion_tokens": 1,
                                                    "routed_experts": _b64([1, 2, 3])}}) + "\n", [],
     ["field 'meta_info.routed_experts'", "not a whole number of tokens"]),
    ("sglang", "s.jsonl", _sg(2, completion_tokens="2"), [], ["field 'meta_info.completion_tokens'",
                                                             "non-negative integer"]),
    ("sglang", "s.jsonl", _sg(2, p=3), [], ["field 'meta_info.routed_experts'", "fewer than the 3 prompt tokens"]),
    ("sglang", "s.jsonl", json.dumps({"text": "hi"}) + "\n", [], ["line 1, field 'meta_info'", "expected a /generate"]),
    ("sglang", "s.jsonl", json.dumps({"meta_info": {"prompt_tokens": 1, "completion_tokens": 2,
                                                    "routed_experts": _b64([[[0, 1], [2, 3]], [[0, 1], [2, 5]]])}})
     + "\n", [], ["response 0, token 1, layer 1, field 'experts'", "expert id 5"]),
    # --- llama.cpp
    ("llamacpp", "m.csv", LC + "1,0\n1,x\n", [], ["line 3, field 'expert'", "'x'"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,1\n2,0\n2,1\n3,0\n3,1\n", [], ["line 2, field 'layer'", "3 distinct layer"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,1\n2,0\n2,1\n2,0\n2,2\n1,0\n1,1\n", [],
     ["line 8, field 'layer'", "the last micro-batch stops"]),
    ("llamacpp", "m.csv", LC + "2,0\n2,1\n1,0\n1,1\n", [], ["line 2, field 'layer'", "layer 2 where layer 1"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,1\n1,2\n2,0\n2,1\n", [], ["line 2, field 'expert'", "not a multiple of top_k 2"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,1\n1,2\n1,3\n2,0\n2,1\n", [], ["line 6, field 'expert'", "routes 1 tokens"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,0\n2,0\n2,1\n", [], ["line 2 (token 0, layer 1), field 'experts'",
                                                           "duplicated expert"]),
    ("llamacpp", "m.csv", LC + "1,0,5\n", [], ["line 2", "has 3 fields, expected 2"]),
    ("llamacpp", "m.csv", LC + "1,0\n1,1\n2,0\n2,1\n", ["--request-lengths", "1:1"],
     ["--request-lengths: the requests hold 2 tokens, the capture m.csv has 1"]),
    ("llamacpp", "m.csv", LC, [], ["m.csv: no rows"]),
]


@pytest.mark.parametrize(("fmt", "name", "content", "extra", "words"), CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str, name: str,
                                      content: str | bytes, extra: list[str], words: list[str]) -> None:
    src = tmp_path / name
    if isinstance(content, bytes):
        src.write_bytes(content)
    else:
        src.write_text(content, encoding="utf-8")
    out = tmp_path / "out.parquet"
    model = [] if fmt == "flame" else TINY
    code = main(["trace", "import", "--from", fmt, str(src), "-o", str(out), *model, *extra])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("simctl: error: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written, no temp file


def test_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


# --------------------------------------------------------------------------------------------
# Fuzzing: random mutations of valid small inputs

TOKENS = ["", "-1", "0", "3", "99999999999999999999", "1e400", "nan", "1.5", "true", "null", "[]", "{}",
          "\x00", "é", ",", "\n", "\"", " ", "prefill", "decode", "2147483648", "٣", "[[", "AAAA"]


def _llamacpp_src() -> str:
    return (DATA / "llamacpp-moe-trace.csv").read_text()


SEEDS: dict[str, tuple[str, Any]] = {
    "csv": ((DATA / "tiny.csv").read_text(), lambda p: import_csv(p, model=TINY_INFO)),
    "jsonl": ((DATA / "tiny.jsonl").read_text(), lambda p: import_jsonl(p, model=TINY_INFO)),
    "flame": (FLAME_H + "".join(f"0,0,{lay},7,{SIX}\n" for lay in range(2, 10)), lambda p: import_flame(p)),
    "vllm": ((DATA / "vllm-responses.jsonl").read_text(), lambda p: import_vllm(p, model=TINY_INFO)),
    "sglang": ((DATA / "sglang-responses.jsonl").read_text(), lambda p: import_sglang(p, model=TINY_INFO)),
    "llamacpp": (_llamacpp_src(), lambda p: import_llamacpp(p, model=TINY_INFO)),
}


@st.composite
def mutants(draw: Any, text: str) -> str:
    """``text`` after 1-4 random edits: delete a span, insert a tricky token, replace a span
    by one, duplicate or drop a line."""
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        kind = draw(st.sampled_from(["delete", "insert", "replace", "dup_line", "drop_line"]))
        i = draw(st.integers(0, max(0, n - 1)))
        j = min(n, i + draw(st.integers(1, 8)))
        tok = draw(st.sampled_from(TOKENS) | st.text(max_size=4))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + tok + text[i:]
        elif kind == "replace":
            text = text[:i] + tok + text[j:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                k = draw(st.integers(0, len(lines) - 1))
                lines = lines[:k] + ([lines[k]] if kind == "dup_line" else []) + lines[k:]
                if kind == "drop_line":
                    del lines[k]
                text = "".join(lines)
    return text


@pytest.mark.parametrize("fmt", list(SEEDS))
def test_fuzzed_inputs_import_or_fail_in_one_line(tmp_path: Path, fmt: str) -> None:
    seed, importer = SEEDS[fmt]

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(text=mutants(seed))
    def check(text: str) -> None:
        src = tmp_path / "in.jsonl"  # the suffix picks vLLM response files
        src.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            importer(src)
        except MoesimError as exc:
            msg = str(exc)
            assert msg and "\n" not in msg and str(src) in msg, msg

    check()
