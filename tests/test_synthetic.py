"""Synthetic generator: valid traces for any knob values in range (hypothesis), internal
consistency of the emitted columns, byte-identical output per seed, presets, parameter errors,
and the knobs moving the statistics they are meant to move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moesim.traces.analysis.stats import trace_stats
from moesim.traces.format.trace_file import DECODE, PREFILL, read_trace, write_trace
from moesim.traces.synthetic.generator import (
    PRESETS,
    SynthError,
    SynthParams,
    generate,
    parse_params,
    synthesize,
)

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


@st.composite
def knobs(draw: Any) -> SynthParams:
    E = draw(st.integers(1, 12))
    prompt = draw(st.integers(0, 6))
    return SynthParams(
        model="mixtral-8x7b",
        num_layers=draw(st.integers(1, 4)), num_experts=E, top_k=draw(st.integers(1, E)),
        requests=draw(st.integers(1, 3)), prompt_len=prompt,
        decode_len=draw(st.integers(1 if prompt == 0 else 0, 6)),
        length_jitter=draw(st.floats(0.0, 0.95)),
        popularity_skew=draw(st.floats(0.0, 8.0)),
        token_locality=draw(st.floats(0.0, 1.0) | st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5)),
        layer_correlation=draw(st.floats(0.0, 1.0)),
        router_temperature=draw(st.floats(0.01, 100.0)),
        num_topics=draw(st.integers(1, 5)),
        topic_strength=draw(st.floats(0.0, 1.0)),
        latent_dim=draw(st.integers(2, 6)),
        embedding_dim=draw(st.integers(1, 5)),
        emit_logits=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32)),
    )


@FAST
@given(params=knobs())
def test_any_knobs_give_a_valid_consistent_trace(tmp_path: Path, params: SynthParams) -> None:
    cols, meta = generate(params)
    path = write_trace(tmp_path / "s.parquet", cols, meta)  # validates on write
    tr = read_trace(path)  # and on read
    m = params.shape()
    L, E, k = m.num_layers, m.num_experts, m.top_k
    assert tr.meta.model == m and tr.meta.source["params"] == params.model_dump()
    T = tr.num_rows // L
    assert tr.embedding is not None and tr.embedding_rows is not None
    np.testing.assert_array_equal(tr.embedding_rows, np.arange(T) * L)
    assert tr.weights is not None
    assert (np.diff(tr.weights, axis=1) <= 0).all() and (tr.weights >= 0).all() and (tr.weights.sum(1) <= 1 + 1e-5).all()
    if params.emit_logits:
        assert tr.logits is not None and tr.lookahead_logits is not None
        lg = tr.logits.astype(np.float32)
        chosen = np.take_along_axis(lg, tr.experts.astype(np.int64), axis=1)
        assert (np.diff(chosen, axis=1) <= 0).all()  # highest first
        if k < E:  # nothing left out beats what was chosen
            mask = np.ones_like(lg, dtype=bool)
            np.put_along_axis(mask, tr.experts.astype(np.int64), False, axis=1)
            assert (lg[mask].reshape(-1, E - k).max(axis=1) <= chosen[:, -1]).all()
        want = np.take_along_axis(_softmax(lg), tr.experts.astype(np.int64), axis=1)
        np.testing.assert_allclose(tr.weights, want, rtol=1e-4, atol=1e-6)
    else:
        assert tr.logits is None and tr.lookahead_logits is None
    # phases: prompt tokens prefill then decode; prefill tokens of a request share one embedding
    first = np.flatnonzero(tr.token_idx[::L] == 0)
    for a, b in zip(first, [*first[1:], T], strict=True):
        ph = tr.phase[::L][a:b]
        assert (np.diff(ph) >= 0).all() and set(ph.tolist()) <= {PREFILL, DECODE}
        emb = tr.embedding[a:b][ph == PREFILL]
        assert (emb == emb[:1]).all()


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    p = SynthParams.from_preset("deepseek-v2-lite", requests=2, prompt_len=8, decode_len=8, num_layers=4)
    a, _, _ = synthesize(p, tmp_path / "a.parquet")
    b, _, _ = synthesize(p, tmp_path / "b.parquet")
    c, _, _ = synthesize(p.model_copy(update={"seed": 1}), tmp_path / "c.parquet")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets(tmp_path: Path, name: str) -> None:
    p = SynthParams.from_preset(name, requests=1, prompt_len=3, decode_len=2, num_layers=3)
    model = name.removesuffix("-legacy")  # a legacy preset keeps its model's name and shape
    assert p.model == model and p.num_layers == 3 and p.requests == 1
    assert p.token_locality == PRESETS[name]["token_locality"]
    cols, meta = generate(p)
    assert meta.model.num_experts == SynthParams(model=model).shape().num_experts
    assert ("token_id" in cols) == (not name.endswith("-legacy"))  # fitted presets carry token identity
    assert cols["experts"].shape == (5 * 3, meta.model.top_k)
    assert SynthParams(preset=name) == SynthParams.from_preset(name)


@pytest.mark.parametrize(("data", "words"), [
    ({"bogus": 1}, "synthetic.bogus: unknown parameter"),
    ({"token_locality": 1.5}, "synthetic.token_locality: Input should be less than or equal to 1"),
    ({"router_temperature": 0}, "synthetic.router_temperature"),
    ({"preset": "gpt-5"}, "unknown preset 'gpt-5'"),
    ({"model": "mixtral"}, "unknown model 'mixtral'"),
    ({"prompt_len": 0, "decode_len": 0}, "prompt_len + decode_len must be at least 1"),
    ({"num_experts": 4, "top_k": 5}, "top_k (5) exceeds num_experts (4)"),
    ({"requests": "many"}, "synthetic.requests"),
])
def test_parameter_errors(data: dict[str, Any], words: str) -> None:
    with pytest.raises(SynthError) as info:
        parse_params(data)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_every_field_has_help() -> None:
    for name, f in SynthParams.model_fields.items():
        assert f.description, name


# --------------------------------------------------------------------------------------------
# The knobs move what they should (common random numbers: same seed, one knob changed)

SMALL = {"model": "mixtral-8x7b", "num_layers": 4, "num_experts": 16, "top_k": 2, "requests": 4,
         "prompt_len": 16, "decode_len": 48, "latent_dim": 16, "embedding_dim": 2}


def _stats(tmp_path: Path, params: SynthParams) -> Any:
    path, _, _ = synthesize(params, tmp_path / "k.parquet")
    return trace_stats(path).overall


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lo=st.floats(0.0, 0.6), delta=st.floats(0.3, 0.5), skew=st.floats(0.0, 2.0),
       topic=st.floats(0.0, 0.6), corr=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_token_locality_raises_reuse(tmp_path: Path, lo: float, delta: float, skew: float, topic: float,
                                     corr: float, seed: int) -> None:
    base = {**SMALL, "popularity_skew": skew, "topic_strength": topic, "layer_correlation": corr, "seed": seed}
    low = _stats(tmp_path, SynthParams(**base, token_locality=lo)).reuse
    high = _stats(tmp_path, SynthParams(**base, token_locality=min(1.0, lo + delta))).reuse
    assert high > low


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lo=st.floats(0.0, 0.6), delta=st.floats(0.3, 0.5), skew=st.floats(0.0, 2.0),
       topic=st.floats(0.0, 0.6), loc=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_layer_correlation_raises_next_layer_accuracy(tmp_path: Path, lo: float, delta: float, skew: float,
                                                      topic: float, loc: float, seed: int) -> None:
    base = {**SMALL, "popularity_skew": skew, "topic_strength": topic, "token_locality": loc, "seed": seed}
    low = _stats(tmp_path, SynthParams(**base, layer_correlation=lo)).next_layer_acc
    high = _stats(tmp_path, SynthParams(**base, layer_correlation=min(1.0, lo + delta))).next_layer_acc
    assert high > low


def test_popularity_skew_lowers_entropy(tmp_path: Path) -> None:
    flat = _stats(tmp_path, SynthParams(**SMALL, popularity_skew=0.0))
    skewed = _stats(tmp_path, SynthParams(**SMALL, popularity_skew=2.0))
    assert skewed.entropy < flat.entropy - 0.05 and skewed.top10_share > flat.top10_share


def test_extreme_knobs() -> None:
    # frozen state: every token of a request routes like the first; c = 1: lookahead is exact
    cols, _ = generate(SynthParams(**SMALL, token_locality=1.0, topic_strength=0.0))
    ex = cols["experts"].reshape(4, 64, 4, 2)
    assert (ex == ex[:, :1]).all()
    cols, _ = generate(SynthParams(**SMALL, layer_correlation=1.0, router_temperature=0.5))
    look = cols["lookahead_logits"].reshape(-1, 4, 16)[:, :-1]
    logits = cols["logits"].reshape(-1, 4, 16)[:, 1:]
    np.testing.assert_array_equal(look, logits)
