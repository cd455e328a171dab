"""Synthetic router traces from a latent-state model of an MoE router.

Not i.i.d. draws: each token carries a latent hidden state per MoE layer, and the routers of
the layers read it. The state of token ``t`` at layer ``l`` is

    h[t, l] = a * mu[z, l] + b * v[w, l] + s * u[t, l],   s = sqrt(1 - a^2 - b^2)

with ``a = topic_strength``, ``mu[z, l]`` the mean of the request's topic ``z`` (one of
``num_topics``, drawn per request), ``b = token_strength``, ``v[w, l]`` the fixed vector of
token id ``w`` at layer ``l`` (the token-identity component, below), and ``u`` the context: a
unit-variance Gaussian field that is

* AR(1) from token to token inside a request with coefficient ``token_locality`` (rho), so
  consecutive tokens route alike (temporal locality), at every layer;
* AR(1) from layer to layer with coefficient ``layer_correlation`` (c): ``u[t, l+1] =
  c * u[t, l] + sqrt(1 - c^2) * eps[t, l+1]``, with each ``eps[., l]`` itself AR(rho) in
  tokens. This is what lets the next layer's router, applied to this layer's state, predict
  the next layer's experts.

Topic means and token vectors follow the same layer recursion. The squared strengths are
variance shares: ``a^2`` topic, ``b^2`` token, the rest context.

Token identity (``token_strength > 0``): every token of the stream is an id ``w`` drawn
independently from a Zipf distribution over ``vocab_size`` ids (``P(w) ~ 1 / (w + 1)^zipf_s``,
id 0 the most frequent), so ids repeat across requests as words do in text; with
``token_repeat`` a token repeats the previous one of its request instead (runs). ``v[w, 0]``
is a seeded Gaussian vector per id, ``v[w, l+1] = c * v[w, l] + sqrt(1 - c^2) * fresh``: a
fixed vector per (token id, layer), independent of the workload (:mod:`.tokens`). A token therefore routes alike
wherever it occurs (what fMoE's expert maps and token-keyed policies exploit), and the ids go
into the ``token_id`` column. With ``token_strength = 0`` nothing of this is drawn and the
output is the same as before the component existed.

Layer ``l`` has a router ``W[l]`` (``[D, E]``, Gaussian) and a bias ``b[l, e] =
-popularity_skew * log(1 + rank[l, e])`` over a random ranking of the experts (a Zipf prior:
long-tailed popularity). Logits are
``(h @ W[l] + b[l]) / router_temperature``, stored as float16; ``experts`` is the top-k of
the stored logits (highest first), ``weights`` their softmax probabilities over all E (not
renormalised), ``lookahead_logits`` the router of layer ``l+1`` (of layer 0 at the last
layer) applied to ``q * h[t, l] + sqrt(1 - q^2) * n[t, l]`` with ``q = lookahead_quality``
and ``n`` independent unit noise (``q = 1``: the state itself, as a tracer records it), and
``embedding`` a fixed random projection of ``h[t, 0]``, averaged over the prompt for prefill
tokens (one prefill iteration), on layer-0 rows.

Everything is vectorised over tokens (one pass per layer, a log-depth scan for the token
recursion); see ``benchmarks/bench_traces.py`` for the measured throughput. The same
parameters give the same file, byte for byte (the routers and topics come from their own
seed streams, so changing the workload size does not change the model).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moesim.sim.config.catalog import CatalogError, model_names
from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import DECODE, PREFILL, ModelInfo, TraceMeta
from moesim.traces.importers.registry import model_info, save_trace
from moesim.traces.synthetic.tokens import hashed_normals, token_stream

GENERATOR_VERSION = 2
"""2: token-identity component and lookahead quality (identical routing to version 1 while
``token_strength = 0`` and ``lookahead_quality = 1``)."""

MAX_MEMORY_BYTES = 16 * 2**30
"""Largest working memory :class:`SynthParams` allows (an estimate, see ``memory_bytes``):
a typo such as ``requests=1000000`` is refused before anything is allocated."""

# Presets: the routed-expert shape of a catalog model plus knob values chosen to look like
# published characterisations of it (strong next-layer predictability for Mixtral, weaker
# locality and a longer tail for the fine-grained models). They are plausible settings, not
# fits to recorded traces, except Mixtral's per-layer reuse:
#
# mixtral-8x7b: ``token_locality`` is a per-layer profile fitted (``python
# benchmarks/fit_mixtral_preset.py``, :mod:`traces.fit`) so that token-to-token expert reuse
# (``simctl trace stats``) rises from 26% at layer 0 to 32% at layer 31 at the preset's
# workload and seed 0 (measured: 26.3% .. 31.9%, at most 1.7 points off the line). Source of
# the range: moesim issue 15, which reports that a real Mixtral-8x7B capture varies 26-32%
# across layers; the linear shape is an assumption (no public per-layer source was found;
# see NOTICE.md). With reuse that close to chance (k/E = 25%), the request-level topic share
# had to drop from 0.4 to 0.15 (0.4 alone gave 28-37% reuse at zero locality).
MIXTRAL_LOCALITY = [
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.054, 0.043, 0.0, 0.0, 0.0, 0.0, 0.038, 0.05, 0.0,
    0.01, 0.043, 0.0, 0.006, 0.011, 0.032, 0.013, 0.035, 0.036, 0.018, 0.053, 0.0, 0.0, 0.028, 0.049, 0.036,
]
PRESETS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": {
        "model": "mixtral-8x7b", "popularity_skew": 0.2, "token_locality": MIXTRAL_LOCALITY,
        "layer_correlation": 0.95, "router_temperature": 1.0, "topic_strength": 0.15,
        "num_topics": 8, "prompt_len": 128, "decode_len": 128, "requests": 8,
    },
    "qwen1.5-moe-a2.7b": {
        "model": "qwen1.5-moe-a2.7b", "popularity_skew": 0.4, "token_locality": 0.2,
        "layer_correlation": 0.9, "router_temperature": 1.0, "topic_strength": 0.5,
        "num_topics": 16, "prompt_len": 128, "decode_len": 128, "requests": 8,
    },
    "deepseek-v2-lite": {
        "model": "deepseek-v2-lite", "popularity_skew": 0.3, "token_locality": 0.2,
        "layer_correlation": 0.92, "router_temperature": 1.0, "topic_strength": 0.45,
        "num_topics": 16, "prompt_len": 128, "decode_len": 128, "requests": 8,
    },
    "olmoe-1b-7b": {
        "model": "olmoe-1b-7b", "popularity_skew": 0.3, "token_locality": 0.25,
        "layer_correlation": 0.88, "router_temperature": 1.0, "topic_strength": 0.5,
        "num_topics": 16, "prompt_len": 128, "decode_len": 128, "requests": 8,
    },
}


class SynthError(MoesimError, ValueError):
    """Invalid generator parameters; the message is one line naming the parameter."""


class SynthParams(BaseModel):
    """Parameters of the synthetic router model. Unknown keys are errors.

    ``preset`` fills every field it names before the other given fields override it, so
    ``SynthParams(preset="olmoe-1b-7b", requests=2)`` is the OLMoE preset with 2 requests.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    preset: str | None = Field(None, description=f"start from a preset ({', '.join(PRESETS)}); given fields override it")
    model: str = Field("mixtral-8x7b", description="catalog model whose routed-expert shape the trace takes")
    num_layers: int | None = Field(None, ge=1, le=1024, description="override the number of MoE layers")
    num_experts: int | None = Field(None, ge=1, le=4096, description="override the routed experts per layer")
    top_k: int | None = Field(None, ge=1, le=4096, description="override the experts selected per token and layer")
    requests: int = Field(8, ge=1, le=1_000_000, description="number of requests (prompts)")
    prompt_len: int = Field(64, ge=0, le=1_000_000, description="prompt tokens per request (prefill)")
    decode_len: int = Field(64, ge=0, le=1_000_000, description="generated tokens per request (decode steps)")
    length_jitter: float = Field(0.0, ge=0.0, lt=1.0, description="relative spread of the lengths: each request's "
                                 "prompt and decode lengths are drawn uniformly in len * [1 - j, 1 + j]")
    popularity_skew: float = Field(0.5, ge=0.0, le=8.0, description="Zipf exponent of the router bias over a random "
                                   "expert ranking (0: no preferred experts; larger: longer-tailed popularity)")
    token_locality: float | list[float] = Field(
        0.5, description="AR(1) coefficient of the hidden state from one token to the next inside a request "
        "(0: independent tokens; 1: frozen state); a list is a per-layer profile, stretched over the layers by "
        "linear interpolation when its length differs from num_layers")
    layer_correlation: float = Field(0.7, ge=0.0, le=1.0, description="correlation of a token's hidden state between "
                                     "consecutive layers (drives next-layer prediction accuracy)")
    router_temperature: float = Field(1.0, gt=0.0, le=100.0, description="divides the router logits: sharpness of the "
                                      "weights (the top-k choice does not depend on it)")
    num_topics: int = Field(8, ge=1, le=100_000, description="prompt-level topics; each request draws one")
    topic_strength: float = Field(0.5, ge=0.0, le=1.0, description="share of the hidden state's amplitude that comes "
                                  "from the request's topic (0: no topics); its square is the topic's share of the "
                                  "variance, and the context (the token-to-token latent) gets what topic and token leave")
    token_strength: float = Field(0.0, ge=0.0, le=1.0, description="share of the hidden state's amplitude that comes "
                                  "from the token's identity: each token id has its own fixed vector per layer, so it "
                                  "routes alike wherever it occurs (0: off, no token_id column; topic_strength^2 + "
                                  "token_strength^2 must be <= 1)")
    vocab_size: int = Field(32000, ge=1, le=262_144, description="token ids the token stream draws from (with "
                            "token_strength > 0)")
    zipf_s: float = Field(1.0, ge=0.0, le=4.0, description="Zipf exponent of the token frequencies: id w has "
                          "probability proportional to 1 / (w + 1)^zipf_s (about 1 for natural text; 0: uniform)")
    token_repeat: float = Field(0.0, ge=0.0, le=0.99, description="probability that a token repeats the previous "
                                "token of its request instead of a fresh Zipf draw (runs such as indentation; the "
                                "frequencies stay Zipf)")
    lookahead_quality: float = Field(1.0, ge=0.0, le=1.0, description="how much of layer l's hidden state the "
                                     "lookahead router reads (1: all of it, as a tracer records lookahead_logits; "
                                     "lower mixes in independent noise, so lookahead recall falls towards chance at 0)")
    latent_dim: int = Field(32, ge=2, le=1024, description="dimension of the latent hidden state")
    embedding_dim: int = Field(16, ge=1, le=8192, description="length of the embedding stored on layer-0 rows")
    emit_logits: bool = Field(True, description="emit the logits and lookahead_logits columns (E float16 each per row)")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of all random draws")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
            return {**PRESETS[name], **data}
        return data

    @field_validator("token_locality")
    @classmethod
    def _locality_range(cls, v: float | list[float]) -> float | list[float]:
        values = v if isinstance(v, list) else [v]
        if not values:
            raise ValueError("a per-layer profile needs at least one value")
        for x in values:
            if not math.isfinite(x) or x > 1.0:
                raise ValueError("Input should be less than or equal to 1")
            if x < 0.0:
                raise ValueError("Input should be greater than or equal to 0")
        return v

    @model_validator(mode="after")
    def _check(self) -> SynthParams:
        if self.prompt_len + self.decode_len < 1:
            raise ValueError("prompt_len + decode_len must be at least 1")
        if self.topic_strength**2 + self.token_strength**2 > 1.0 + 1e-12:
            raise ValueError(f"token_strength {self.token_strength} with topic_strength {self.topic_strength}: "
                             "topic_strength^2 + token_strength^2 must be <= 1 (they are shares of one variance)")
        try:
            info = self.shape()
        except CatalogError as exc:
            raise ValueError(str(exc)) from None
        need = self.memory_bytes(info)
        if need > MAX_MEMORY_BYTES:
            rows = self.max_rows(info)
            raise ValueError(f"the trace would have up to {rows:,} rows and take about {need / 2**30:,.0f} GiB of "
                             f"memory to generate (the limit is {MAX_MEMORY_BYTES / 2**30:.0f} GiB); lower requests, "
                             "prompt_len or decode_len")
        return self

    def max_rows(self, info: ModelInfo) -> int:
        """Rows of the trace at the longest lengths the jitter allows."""
        per_request = math.ceil((self.prompt_len + self.decode_len) * (1 + self.length_jitter))
        return self.requests * per_request * info.num_layers

    def memory_bytes(self, info: ModelInfo) -> int:
        """An upper estimate of the generator's working memory: per row the latent state and its
        innovations (float64), the logits in float32 and float16 (twice with lookahead), the
        experts and weights; checked before anything is allocated."""
        E, k = info.num_experts, info.top_k
        per_row = 16 * self.latent_dim + 12 * E + (4 * E if self.emit_logits else 0) + 6 * k + 16
        if self.lookahead_quality < 1.0 and self.emit_logits:
            per_row += 8 * self.latent_dim
        vocab = 40 * min(self.vocab_size, self.max_rows(info) // info.num_layers) * self.latent_dim \
            if self.token_strength > 0 else 0
        return self.max_rows(info) * per_row + vocab

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> SynthParams:
        """The preset ``name`` with ``overrides`` applied (raises :class:`SynthError`)."""
        return parse_params({"preset": name, **overrides})

    def locality_profile(self) -> np.ndarray:
        """The token locality of every layer (``[L]``): the scalar repeated, or the list
        stretched over the layers by linear interpolation in relative depth."""
        L = self.shape().num_layers
        if not isinstance(self.token_locality, list):
            return np.full(L, float(self.token_locality))
        prof = np.asarray(self.token_locality, dtype=np.float64)
        if len(prof) == L:
            return prof
        if len(prof) == 1 or L == 1:
            return np.full(L, float(prof.mean() if L == 1 else prof[0]))
        return np.interp(np.linspace(0.0, 1.0, L), np.linspace(0.0, 1.0, len(prof)), prof)

    def shape(self) -> ModelInfo:
        """The routed-expert shape of the trace: the catalog model with any overrides."""
        info = model_info(self.model, num_layers=self.num_layers, num_experts=self.num_experts, top_k=self.top_k)
        if (self.num_layers, self.num_experts, self.top_k) != (None, None, None) and self.model in model_names():
            info = ModelInfo(
                name=f"{self.model}(L={info.num_layers},E={info.num_experts},k={info.top_k})",
                num_layers=info.num_layers, num_experts=info.num_experts, top_k=info.top_k,
                num_shared_experts=info.num_shared_experts,
            )
        return info


def parse_params(data: dict[str, Any]) -> SynthParams:
    """Validate a mapping into :class:`SynthParams`, turning a pydantic error into a one-line
    :class:`SynthError` naming the first bad field."""
    try:
        return SynthParams(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(["synthetic", *(str(x) for x in err["loc"])])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown parameter (known: {', '.join(SynthParams.model_fields)})"
        raise SynthError(f"{loc}: {msg}") from None


# --------------------------------------------------------------------------------------------
# The model


def _ar_scan(x: np.ndarray, pos: np.ndarray, rho: float) -> np.ndarray:
    """In place, turn innovations into a segmented AR(1) series: ``x[i] += rho * x[i-1]``
    whenever row ``i`` continues the same request (``pos[i] > 0``). Log-depth doubling scan
    (Hillis-Steele): after the step with shift ``d`` each row holds its last ``2d`` terms."""
    if rho == 0.0 or x.shape[0] < 2:
        return x
    n = x.shape[0]
    d = 1
    max_pos = int(pos.max()) if pos.size else 0
    while d <= max_pos:
        coef = rho**d
        if coef < 1e-12:  # contributions further back are below float32 resolution
            break
        keep = (pos[d:] >= d).astype(x.dtype)[:, None]
        x[d:] += x[: n - d] * (keep * np.float32(coef))
        d *= 2
    return x


def innovation_locality(profile: np.ndarray, c: float) -> np.ndarray:
    """Per-layer AR coefficients of the fresh part ``eps[., l]`` that give the hidden state
    ``u[., l]`` the token-to-token correlation ``profile[l]``: since ``u[l] = c u[l-1] +
    sqrt(1 - c^2) eps[l]``, its lag-1 correlation is ``c^2 r[l-1] + (1 - c^2) rho[l]``, so
    ``rho[l] = (r[l] - c^2 r[l-1]) / (1 - c^2)``, clipped to ``0..1`` (a profile that changes
    faster than ``1 - c^2`` per layer cannot be met; :func:`achieved_locality` says what is).
    At ``c = 1`` every layer keeps layer 0's state, hence its locality."""
    r = np.asarray(profile, dtype=np.float64)
    out = r.copy()
    c2 = c * c
    if c2 < 1.0:
        out[1:] = np.clip((r[1:] - c2 * r[:-1]) / (1.0 - c2), 0.0, 1.0)
    return out


def achieved_locality(profile: np.ndarray, c: float) -> np.ndarray:
    """The lag-1 token correlation of ``u[., l]`` that :func:`innovation_locality`'s
    coefficients really give (equal to ``profile`` unless clipping bit)."""
    rho = innovation_locality(profile, c)
    out = np.empty_like(rho)
    c2 = c * c
    out[0] = rho[0]
    for lay in range(1, len(rho)):
        out[lay] = c2 * out[lay - 1] + (1.0 - c2) * rho[lay] if c2 < 1.0 else out[lay - 1]
    return out


def _topk_desc(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries of each row, highest first (equal values: lower
    index first; which of equal values at the k-th place gets in is up to argpartition)."""
    e = logits.shape[1]
    if k < e:
        idx = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    else:
        idx = np.broadcast_to(np.arange(e), logits.shape).copy()
    vals = np.take_along_axis(logits, idx, axis=1)
    order = np.lexsort((idx, -vals), axis=1)
    return np.take_along_axis(idx, order, axis=1)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def generate(params: SynthParams) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Generate a trace. Returns ``(columns, meta)`` for :func:`traces.format.write_trace`:
    ``request_id, token_idx, phase`` (codes 0 prefill / 1 decode), ``layer``, ``experts``
    ``[rows, k]`` int16, ``weights`` ``[rows, k]`` float32, ``logits`` and
    ``lookahead_logits`` ``[rows, E]`` float16 (unless ``emit_logits`` is false),
    ``embedding`` ``[tokens, embedding_dim]`` float16 with ``embedding_rows`` (its layer-0
    row indices), and ``token_id`` (int32) when ``token_strength > 0``. Rows: requests in
    order, tokens in order, layers ``0..L-1``."""
    info = params.shape()
    L, E, k = info.num_layers, info.num_experts, info.top_k
    H, T = params.latent_dim, params.router_temperature
    c, a, b = params.layer_correlation, params.topic_strength, params.token_strength
    q = params.lookahead_quality
    rho = 0.0 if isinstance(params.token_locality, list) else float(params.token_locality)

    # seed streams: the first four are version 1's (same children whatever the count spawned)
    seeds = np.random.SeedSequence(params.seed).spawn(7)
    g_model, g_topic, g_len, g_tok = (np.random.default_rng(s) for s in seeds[:4])
    vocab_key = int(seeds[4].generate_state(1, np.uint64)[0])
    g_words, g_noise = (np.random.default_rng(s) for s in seeds[5:])

    # The model: routers, biases, topics and the embedding projection (workload-independent).
    routers = (g_model.standard_normal((L, H, E)) / math.sqrt(H)).astype(np.float32)
    ranks = np.argsort(g_model.random((L, E)), axis=1).astype(np.float64)
    bias = -params.popularity_skew * np.log1p(ranks)
    bias -= bias.mean(axis=1, keepdims=True)
    bias32 = bias.astype(np.float32)
    proj = (g_model.standard_normal((H, params.embedding_dim)) / math.sqrt(H)).astype(np.float32)
    topics = np.empty((params.num_topics, L, H), dtype=np.float32)
    topics[:, 0] = g_topic.standard_normal((params.num_topics, H))
    for lay in range(1, L):
        fresh = g_topic.standard_normal((params.num_topics, H))
        topics[:, lay] = c * topics[:, lay - 1] + math.sqrt(1.0 - c * c) * fresh

    # The workload: request lengths and topics.
    R = params.requests

    def lengths(base: int) -> np.ndarray:
        if base == 0:
            return np.zeros(R, dtype=np.int64)
        f = g_len.uniform(1.0 - params.length_jitter, 1.0 + params.length_jitter, R)
        return np.maximum(1, np.rint(base * f)).astype(np.int64)

    p_len, d_len = lengths(params.prompt_len), lengths(params.decode_len)
    topic_of_req = g_len.integers(0, params.num_topics, R)
    per_req = p_len + d_len
    N = int(per_req.sum())
    req_of_tok = np.repeat(np.arange(R, dtype=np.int64), per_req)
    starts = np.concatenate([[0], np.cumsum(per_req)[:-1]])
    pos = np.arange(N, dtype=np.int64) - starts[req_of_tok]
    phase_tok = np.where(pos < p_len[req_of_tok], PREFILL, DECODE).astype(np.int8)
    topic_of_tok = topic_of_req[req_of_tok]
    words = token_stream(g_words, pos, params.vocab_size, params.zipf_s, params.token_repeat) if b > 0 else None
    if words is not None:  # the vectors of the ids that occur, as rows of ``vocab``
        ids, word_row = np.unique(words, return_inverse=True)
        vocab = np.empty((len(ids), H), dtype=np.float32)

    experts = np.empty((N, L, k), dtype=np.int16)
    weights = np.empty((N, L, k), dtype=np.float32)
    logits_out = np.empty((N, L, E), dtype=np.float16) if params.emit_logits else None
    look_out = np.empty((N, L, E), dtype=np.float16) if params.emit_logits else None
    # innovations: the first token of a request starts at the stationary variance
    per_layer = isinstance(params.token_locality, list)
    rhos = innovation_locality(params.locality_profile(), c) if per_layer else np.full(L, rho)
    innov_scale = np.where(pos == 0, 1.0, math.sqrt(max(0.0, 1.0 - rho * rho))).astype(np.float32)[:, None]
    sa = np.float32(math.sqrt(max(0.0, 1.0 - a * a - b * b)))
    sc = np.float32(math.sqrt(1.0 - c * c))
    sq = np.float32(math.sqrt(1.0 - q * q))
    u = np.empty((N, H), dtype=np.float32)
    emb_tok = np.empty((N, params.embedding_dim), dtype=np.float32)
    for lay in range(L):
        eps = g_tok.standard_normal((N, H), dtype=np.float32)
        if per_layer:
            r_l = float(rhos[lay])
            eps *= np.where(pos == 0, 1.0, math.sqrt(max(0.0, 1.0 - r_l * r_l))).astype(np.float32)[:, None]
            _ar_scan(eps, pos, r_l)
        else:
            eps *= innov_scale
            _ar_scan(eps, pos, rho)
        if lay == 0:
            u[:] = eps
        else:
            u *= np.float32(c)
            eps *= sc
            u += eps
        h = topics[topic_of_tok, lay]
        h *= np.float32(a)
        h += sa * u
        if words is not None:
            fresh = hashed_normals(vocab_key, ids, lay, H)
            if lay == 0:
                vocab[:] = fresh
            else:
                vocab *= np.float32(c)
                fresh *= sc
                vocab += fresh
            h += np.float32(b) * vocab[word_row]
        if lay == 0:
            np.matmul(h, proj, out=emb_tok)
        lg = (h @ routers[lay] + bias32[lay]) * np.float32(1.0 / T)
        lg16 = lg.astype(np.float16)
        lg = lg16.astype(np.float32)  # choose and weigh from the stored values
        top = _topk_desc(lg, k)
        experts[:, lay] = top
        weights[:, lay] = np.take_along_axis(_softmax(lg), top, axis=1)
        if logits_out is not None and look_out is not None:
            logits_out[:, lay] = lg16
            nxt = (lay + 1) % L
            seen = h
            if q < 1.0:
                seen = np.float32(q) * h + sq * g_noise.standard_normal((N, H), dtype=np.float32)
            look_out[:, lay] = ((seen @ routers[nxt] + bias32[nxt]) * np.float32(1.0 / T)).astype(np.float16)

    # Embedding of the iteration: a prefill iteration is the whole prompt (mean over it).
    csum = np.concatenate([np.zeros((1, params.embedding_dim)), np.cumsum(emb_tok, axis=0, dtype=np.float64)])
    prompt_mean = (csum[starts + p_len] - csum[starts]) / np.maximum(p_len, 1)[:, None]
    is_prefill = phase_tok == PREFILL
    emb = emb_tok.astype(np.float64)
    emb[is_prefill] = prompt_mean[req_of_tok[is_prefill]]

    rows = N * L
    cols: dict[str, np.ndarray] = {
        "request_id": np.repeat(req_of_tok, L).astype(np.int32),
        "token_idx": np.repeat(pos, L).astype(np.int32),
        "phase": np.repeat(phase_tok, L),
        "layer": np.tile(np.arange(L, dtype=np.int16), N),
        "experts": experts.reshape(rows, k),
        "weights": weights.reshape(rows, k),
    }
    if logits_out is not None and look_out is not None:
        cols["logits"] = logits_out.reshape(rows, E)
        cols["lookahead_logits"] = look_out.reshape(rows, E)
    if words is not None:
        cols["token_id"] = np.repeat(words, L).astype(np.int32)
    cols["embedding"] = emb.astype(np.float16)
    cols["embedding_rows"] = np.arange(N, dtype=np.int64) * L
    source = {"generator": "moesim.synthetic", "generator_version": GENERATOR_VERSION,
              "params": params.model_dump()}
    return cols, TraceMeta(model=info, source=source)


def synthesize(params: SynthParams, path: str | os.PathLike[str]) -> tuple[Path, TraceMeta, int]:
    """Generate a trace and write it to ``path`` atomically; returns ``(path, meta, rows)``."""
    cols, meta = generate(params)
    rows = int(cols["request_id"].shape[0])
    return save_trace(path, cols, meta), meta, rows
