"""The torch tracer (``traces/tracer/tracer.py``) on tiny random models (its command line:
``tests/test_tracer_cli.py``).

Every supported architecture is built from a tiny config with random weights (CPU, float32)
and checked against the model itself: the recorded experts are the top-k of the model's own
router logits (``output_router_logits``, routed by an independent reference of each rule), the
lookahead logits are the next router applied to the captured router input, phases and token
order follow generation, teacher forcing reproduces generation routing, and every file
passes the trace validator. Tests that need torch skip without the ``tracer`` extra.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import read_trace
from tests.tracer_models import ARCHS, COMMON, NEW, PROMPT, build_model, torch_or_skip

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tr() -> Any:
    """The tracer module (skips without torch/transformers)."""
    torch_or_skip()
    from moesim.traces.tracer import tracer
    return tracer


@cache
def _generation(model_type: str) -> Any:
    """One generation trace of PROMPT (shared by several tests; the model is not changed)."""
    from moesim.traces.tracer import tracer

    return tracer.trace_model(build_model(model_type), [tracer.Prompt(PROMPT)], name=model_type,
                              max_new_tokens=NEW, stop_at_eos=False)


def _routers(model: Any) -> list[Any]:
    """The routers, found independently of the tracer (class name), in model order."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]


def _reference_topk(rule: str, logits: np.ndarray, model: Any, router: Any, k: int) -> np.ndarray:
    """Independent numpy reference of each architecture's expert choice, highest first."""
    return np.argsort(-_reference_scores(rule, logits, model, router), axis=1, kind="stable")[:, :k]


def _reference_scores(rule: str, logits: np.ndarray, model: Any, router: Any) -> np.ndarray:
    """The selection scores ``[N, E]`` of each rule (-inf outside the chosen groups)."""
    x = logits.astype(np.float64)
    cfg = model.config
    if rule in ("softmax", "logits"):
        score = x  # softmax is monotone: its top-k is the logits' top-k
    elif rule == "v2_grouped":
        p = np.exp(x - x.max(1, keepdims=True))
        score = p / p.sum(1, keepdims=True)
        g = score.reshape(len(x), cfg.n_group, -1).max(-1)
        keep = np.argsort(-g, axis=1, kind="stable")[:, : cfg.topk_group]
        mask = np.zeros_like(g, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        score = np.where(np.repeat(mask, x.shape[1] // cfg.n_group, axis=1), score, -np.inf)
    elif rule == "v3_grouped":
        score = 1 / (1 + np.exp(-x)) + router.e_score_correction_bias.double().numpy()
        g = np.sort(score.reshape(len(x), cfg.n_group, -1), axis=-1)[..., -2:].sum(-1)
        keep = np.argsort(-g, axis=1, kind="stable")[:, : cfg.topk_group]
        mask = np.zeros_like(g, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        score = np.where(np.repeat(mask, x.shape[1] // cfg.n_group, axis=1), score, -np.inf)
    else:
        raise AssertionError(rule)
    return score


def _assert_topk_up_to_ties(rec: np.ndarray, score: np.ndarray, k: int, tol: float = 1e-4) -> None:
    """``rec`` is a top-k of ``score``, highest first, up to near-ties (float rounding between a
    cached decode step and a full forward may swap experts whose scores differ by < tol)."""
    best = -np.sort(-score, axis=1)[:, :k]
    got = np.take_along_axis(score, rec.astype(np.int64), axis=1)
    np.testing.assert_allclose(got, best, atol=tol, rtol=0)


def _rows(result: Any, name: str, layer: int) -> np.ndarray:
    cols = result.columns
    return np.asarray(cols[name])[np.asarray(cols["layer"]) == layer]


# --------------------------------------------------------------------------------------------
# Architectures


@pytest.mark.tracer
def test_every_required_architecture_is_in_the_table(tr: Any) -> None:
    avail = tr.supported_architectures()
    for name in ("Mixtral", "Qwen2-MoE", "Qwen3-MoE", "OLMoE", "DeepSeek-V2", "DeepSeek-V3", "Phi-MoE"):
        assert avail[name], f"{name} missing from the installed transformers"


@pytest.mark.tracer
@pytest.mark.parametrize("model_type", list(ARCHS))
def test_experts_are_the_models_own_topk(tr: Any, model_type: str) -> None:
    torch = torch_or_skip()
    model = build_model(model_type)
    _, rule, shared = ARCHS[model_type]
    res = _generation(model_type)
    L, k = res.model.num_layers, res.model.top_k
    overrides = ARCHS[model_type][0]
    E = next(overrides[key] for key in ("num_local_experts", "num_experts", "n_routed_experts") if key in overrides)
    assert res.model.num_experts == E == res.columns["logits"].shape[1]
    assert k == (2 if model_type == "phimoe" else model.config.num_experts_per_tok)
    assert res.model.num_shared_experts == shared
    routers = _routers(model)
    assert len(routers) == L  # dense layers (DeepSeek's first, Qwen2-MoE's mlp_only) are not counted

    # the prefill: the same forward without the tracer, with the model's own router logits
    with torch.inference_mode():
        out = model(torch.tensor([PROMPT]), output_router_logits=True, use_cache=False)
    assert len(out.router_logits) == L
    P = len(PROMPT)
    for layer in range(L):
        ref_logits = out.router_logits[layer].float().numpy()
        rec_experts = _rows(res, "experts", layer)[:P]
        ref = _reference_topk(rule, ref_logits, model, routers[layer], k)
        np.testing.assert_array_equal(rec_experts, ref)
        np.testing.assert_allclose(_rows(res, "logits", layer)[:P].astype(np.float32), ref_logits,
                                   rtol=2e-3, atol=1e-4)
        probs = torch.softmax(out.router_logits[layer].float(), -1).numpy()
        np.testing.assert_allclose(_rows(res, "weights", layer)[:P],
                                   np.take_along_axis(probs, ref, 1), rtol=1e-5)

    # every token (decode included): the model's own logits over the whole sequence
    seq = list(PROMPT) + res.generated[0][:-1]
    with torch.inference_mode():
        full = model(torch.tensor([seq]), output_router_logits=True, use_cache=False)
    for layer in range(L):
        ref_logits = full.router_logits[layer].float().numpy()
        rec = _rows(res, "experts", layer)
        _assert_topk_up_to_ties(rec, _reference_scores(rule, ref_logits, model, routers[layer]), k)
        np.testing.assert_allclose(_rows(res, "logits", layer).astype(np.float32), ref_logits,
                                   rtol=5e-3, atol=1e-3)


@pytest.mark.tracer
@pytest.mark.parametrize(("model_type", "dtype"), [(m, "float32") for m in ARCHS]
                         + [("mixtral", "bfloat16"), ("deepseek_v3", "bfloat16")])
def test_lookahead_is_next_router_on_the_router_input(tr: Any, model_type: str, dtype: str) -> None:
    """Also in bfloat16: Mixtral's router computes in bf16, DeepSeek-V3's in float32."""
    torch = torch_or_skip()
    model = build_model(model_type, dtype)
    routers = _routers(model)
    L = len(routers)
    seen_in: list[list[Any]] = [[] for _ in range(L)]
    seen_idx: list[list[Any]] = [[] for _ in range(L)]
    handles = []
    for i, r in enumerate(routers):
        def hook(mod: Any, args: Any, output: Any, _i: int = i) -> None:
            seen_in[_i].append(args[0].reshape(-1, args[0].shape[-1]).clone())
            seen_idx[_i].append(output[2].reshape(-1, output[2].shape[-1]).clone())
        handles.append(r.register_forward_hook(hook))
    try:
        res = tr.trace_model(model, [tr.Prompt(PROMPT)], name=model_type, max_new_tokens=4,
                             stop_at_eos=False)
    finally:
        for h in handles:
            h.remove()
    with torch.inference_mode():
        for layer in range(L):
            x = torch.cat(seen_in[layer])
            nxt = routers[(layer + 1) % L]
            expect = nxt(x)[0].float().numpy()
            got = _rows(res, "lookahead_logits", layer).astype(np.float32)
            assert got.shape == expect.shape
            np.testing.assert_allclose(got, expect, rtol=2e-3, atol=1e-4)
            # and the recorded experts are the router's own choice, as a set
            chosen = np.sort(torch.cat(seen_idx[layer]).numpy(), axis=1)
            np.testing.assert_array_equal(np.sort(_rows(res, "experts", layer), axis=1), chosen)


@pytest.mark.tracer
@pytest.mark.parametrize("model_type", list(ARCHS))
def test_phases_token_order_and_file(tr: Any, model_type: str, tmp_path: Path) -> None:
    res = _generation(model_type)
    L = res.model.num_layers
    P, T = len(PROMPT), len(PROMPT) + NEW - 1  # N new tokens: N-1 decode iterations
    assert len(res.generated[0]) == NEW
    path = tr.record_trace(tmp_path / "t.parquet", res)
    trace = read_trace(path)  # validates order, phases, widths, finiteness
    assert trace.num_rows == T * L
    np.testing.assert_array_equal(trace.token_idx[::L], np.arange(T))
    np.testing.assert_array_equal(trace.layer, np.tile(np.arange(L), T))
    np.testing.assert_array_equal(trace.phase[::L], [0] * P + [1] * (NEW - 1))
    assert trace.token_id is not None
    np.testing.assert_array_equal(trace.token_id[::L], list(PROMPT) + res.generated[0][:-1])
    assert trace.meta.model == res.model
    assert trace.meta.source["mode"] == "generation"
    # iteration embeddings on layer-0 rows only: the prompt's mean, then each decode token
    assert trace.embedding is not None and trace.embedding_rows is not None
    np.testing.assert_array_equal(trace.embedding_rows, np.arange(T) * L)
    torch = torch_or_skip()
    emb = build_model(model_type).get_input_embeddings()
    with torch.inference_mode():
        e = emb(torch.tensor(list(PROMPT) + res.generated[0][:-1])).float().numpy()
    expect = np.concatenate([np.repeat(e[:P].mean(0, keepdims=True), P, 0), e[P:]])
    np.testing.assert_allclose(trace.embedding.astype(np.float32), expect, rtol=2e-3, atol=1e-4)


@pytest.mark.tracer
@pytest.mark.parametrize("model_type", list(ARCHS))
def test_teacher_forcing_reproduces_generation(tr: Any, model_type: str) -> None:
    gen = _generation(model_type)
    model = build_model(model_type)
    tf = tr.trace_model(model, [tr.Prompt(PROMPT, tuple(gen.generated[0][:-1]))], name=model_type,
                        teacher_forced=True)
    for col in ("request_id", "token_idx", "phase", "layer", "token_id"):
        np.testing.assert_array_equal(tf.columns[col], gen.columns[col], err_msg=col)
    differ = (tf.columns["experts"] != gen.columns["experts"]).any(axis=1)
    assert differ.sum() <= 1, f"{differ.sum()} of {len(differ)} rows differ"  # a near-tie at most
    np.testing.assert_allclose(tf.columns["logits"].astype(np.float32),
                               gen.columns["logits"].astype(np.float32), rtol=5e-3, atol=1e-3)
    assert tf.source["mode"] == "teacher-forced"


@pytest.mark.tracer
def test_teacher_forced_text_without_completion_is_all_decode(tr: Any, tmp_path: Path) -> None:
    model = build_model("mixtral")
    res = tr.trace_model(model, [tr.Prompt(PROMPT), tr.Prompt((1, 2, 3))], name="m", teacher_forced=True)
    trace = read_trace(tr.record_trace(tmp_path / "t.parquet", res))
    L = res.model.num_layers
    assert (trace.phase == 1).all()
    np.testing.assert_array_equal(trace.request_id[::L], [0] * len(PROMPT) + [1] * 3)
    np.testing.assert_array_equal(trace.token_idx[::L], list(range(len(PROMPT))) + [0, 1, 2])
    assert trace.embedding is not None and trace.embedding.shape == (len(PROMPT) + 3, COMMON["hidden_size"])


@pytest.mark.tracer
def test_greedy_generation_matches_transformers_generate(tr: Any) -> None:
    torch = torch_or_skip()
    model = build_model("mixtral")
    res = tr.trace_model(model, [tr.Prompt(PROMPT)], name="m", max_new_tokens=8)  # stops at EOS
    with torch.inference_mode():
        ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))
    assert res.generated[0] == ref[0, len(PROMPT):].tolist()


@pytest.mark.tracer
def test_sampling_is_seeded_per_request(tr: Any) -> None:
    model = build_model("qwen3_moe")
    a, b = tr.Prompt(PROMPT), tr.Prompt((9, 8, 7))
    kw: dict[str, Any] = dict(name="m", max_new_tokens=6, sample=True, stop_at_eos=False)
    r1 = tr.trace_model(model, [a, b], seed=7, **kw)
    r2 = tr.trace_model(model, [tr.Prompt((1, 2)), b], seed=7, **kw)
    r3 = tr.trace_model(model, [a, b], seed=8, **kw)
    assert r1.generated == tr.trace_model(model, [a, b], seed=7, **kw).generated
    # request 1 samples from (seed, 1) whatever request 0 was
    assert r1.generated[1] == r2.generated[1]
    assert tr.request_generator(7, 1, "cpu").initial_seed() != tr.request_generator(7, 0, "cpu").initial_seed()
    assert r1.generated != r3.generated
    assert r1.source["sampling"] == "sample (temperature 1.0)"


@pytest.mark.tracer
def test_recorder_follows_transformers_generate(tr: Any) -> None:
    torch = torch_or_skip()
    model = build_model("olmoe")

    def hooks() -> int:  # transformers keeps hooks of its own (output capturing)
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    before = hooks()
    with tr.Tracer(model) as t, torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))
        rec = t.recorder.finish_request()
    assert rec.num_tokens == len(PROMPT) + 3
    np.testing.assert_array_equal(rec.phase, [0] * len(PROMPT) + [1] * 3)
    np.testing.assert_array_equal(rec.token_id, out[0, :-1].numpy())
    # hooks come off with the tracer
    assert hooks() == before


class _EventLog:
    """A CallTimer that logs its calls (the calibration harness would record CUDA events)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def start(self, kind: str, index: int) -> None:
        self.events.append(("start", kind, index))

    def stop(self, kind: str, index: int) -> None:
        self.events.append(("stop", kind, index))


@pytest.mark.tracer
def test_timer_hooks_wrap_attention_router_experts(tr: Any) -> None:
    model = build_model("deepseek_v3")  # layer 0 is dense: attention only
    log = _EventLog()
    plain = tr.trace_model(model, [tr.Prompt(PROMPT[:3])], name="m", max_new_tokens=1)
    timed = tr.trace_model(model, [tr.Prompt(PROMPT[:3])], name="m", max_new_tokens=1, timers=[log])
    np.testing.assert_array_equal(plain.columns["experts"], timed.columns["experts"])
    assert log.events == [
        ("start", "attention", 0), ("stop", "attention", 0),
        ("start", "attention", 1), ("stop", "attention", 1),
        ("start", "router", 0), ("stop", "router", 0), ("start", "experts", 0), ("stop", "experts", 0),
        ("start", "attention", 2), ("stop", "attention", 2),
        ("start", "router", 1), ("stop", "router", 1), ("start", "experts", 1), ("stop", "experts", 1),
    ]


@pytest.mark.tracer
def test_rules_agree_with_the_routers(tr: Any) -> None:
    """RoutingRule.select (used for routers that return bare logits) picks the router's experts."""
    torch = torch_or_skip()
    for model_type in ARCHS:
        model = build_model(model_type)
        reg = tr.HookRegistry(model)
        x = torch.randn(64, COMMON["hidden_size"])
        with torch.inference_mode():
            for layer, rule in zip(reg.layers, reg.rules, strict=True):
                logits, _, idx = layer.router(x)
                k = idx.shape[1]
                mine = rule.select(logits, layer.router, k)
                assert torch.equal(mine.sort(1).values, idx.long().sort(1).values), model_type


@pytest.mark.tracer
def test_selected_columns_only(tr: Any, tmp_path: Path) -> None:
    res = tr.trace_model(build_model("mixtral"), [tr.Prompt(PROMPT)], name="m", max_new_tokens=2,
                         columns={"token_id"})
    trace = read_trace(tr.record_trace(tmp_path / "t.parquet", res))
    assert trace.token_id is not None
    assert trace.logits is None and trace.lookahead_logits is None and trace.weights is None
    assert trace.embedding is None


@pytest.mark.tracer
def test_unsupported_model_names_its_class(tr: Any) -> None:
    torch_or_skip()
    import transformers

    cfg = transformers.AutoConfig.for_model("llama", **{**COMMON, "num_hidden_layers": 1})
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(MoesimError, match=r"LlamaForCausalLM: no supported MoE router"):
        tr.Tracer(model)


@pytest.mark.tracer
def test_batched_call_is_refused(tr: Any) -> None:
    torch = torch_or_skip()
    model = build_model("mixtral")
    with tr.Tracer(model), pytest.raises(MoesimError, match="batch size 1"), torch.inference_mode():
        model(torch.tensor([PROMPT, PROMPT]))
