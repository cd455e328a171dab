"""Record moe-trace v1 files from Hugging Face transformers MoE models (extra ``tracer``).

The tracer modules are the only moesim modules that import torch (and, lazily, transformers);
nothing else imports them at import time. They are, one idea each:

:mod:`traces.arch`
    the architecture table: which MoE models are supported, how their routers route, and
    where their MoE layers are (:func:`~traces.arch.find_moe_layers`).
:mod:`traces.recorder`
    the hooks: :class:`~traces.recorder.HookRegistry` and the
    :class:`~traces.recorder.RoutingRecorder`, plus the calibration timers' hook order.
:mod:`traces.prompts`
    reading a prompts file (needs no torch).
:mod:`traces.model_loading`
    loading a local model directory or building one from a config.
this module
    driving the model (generation, teacher forcing: :class:`Tracer`) and assembling a whole
    trace (:func:`trace_model`, :func:`record_trace`).

What is recorded
----------------
The recorder hangs a forward hook on every router and one on the input embedding. Per token
and MoE layer it records:

``experts``
    the model's own top-k: the expert ids the router returned (the router itself applies the
    architecture's rule: softmax-then-top-k, top-k-then-softmax, grouped top-k, bias
    correction), ordered highest selection score first. The selection score is the softmax
    probability (= the logit order) for softmax routers, ``sigmoid(logit) + e_score_correction_bias``
    for DeepSeek-V3/GLM-4-MoE, the logit for GPT-OSS and Phi-MoE. Routers that return logits
    only (older transformers releases) are routed by :meth:`traces.arch.RoutingRule.select`.
``weights``
    ``softmax(logits)`` over all E experts, gathered at ``experts``, float32, **not**
    renormalised over the k. For sigmoid routers (DeepSeek-V3, GLM-4-MoE) this is still the
    softmax over all E of the raw logits (the column's contract); the model's own gate scores
    are ``sigmoid(logits)`` and can be recovered from the ``logits`` column.
``logits``
    all E raw router logits (float16).
``lookahead_logits``
    the router of MoE layer ``l+1`` applied to the input of router ``l``; at the last MoE
    layer, router 0 applied to it (float16). Computed as the router's own linear map
    ``F.linear(x, W, b)`` in the dtype of its logits, without calling the module (so no hook
    or timer fires); the tests check it against calling the next router module.
``token_id``
    the input token id of the row's token.
``embedding``
    on layer-0 rows only: the iteration embedding, i.e. the input-embedding output averaged
    over the tokens of the iteration the token belongs to (all prompt tokens for a prefill,
    the token itself for a decode step), float16.

Modes
-----
Generation (:meth:`Tracer.generate`): the prompt is one prefill iteration (phase
``prefill``, token_idx ``0..P-1``), then each decode step feeds the last generated token
through the model with the KV cache (phase ``decode``). ``max_new_tokens = N`` generates N
tokens, which takes N-1 decode iterations: the last generated token is never fed back, so it
has no rows. Greedy (argmax) or sampled (softmax of logits / temperature, from a
``torch.Generator`` seeded per request from ``(seed, request_id)``). Generation stops early
at an EOS token unless EOS is ignored.

Teacher-forced (:meth:`Tracer.teacher_forced`): the whole text runs in one forward (no
cache). Routing of a causal model does not depend on later tokens, so each token's routing is
what generation would have produced had it chosen that text (``docs/contract.md``; checked by the
tests up to float rounding). Rows are labelled as the equivalent generation would: with a
``completion``, the prompt tokens are one prefill iteration and each completion token a decode
iteration; a text without a completion is recorded as decode rows only, one iteration per
token (a corpus read token by token).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.lib_warnings import quiet_library_warnings
from moesim.traces.format.trace_file import (
    DECODE,
    PREFILL,
    ModelInfo,
    TraceMeta,
    embedding_list_array,
    write_trace,
)
from moesim.traces.tracer.arch import model_config
from moesim.traces.tracer.prompts import Prompt
from moesim.traces.tracer.recorder import (
    ALL_OPTIONAL,
    CallTimer,
    HookRegistry,
    RequestRecord,
    RoutingRecorder,
)

# isort: split
# Re-exports, kept so that ``tracer.X`` (the tests' ``tr`` fixture, scripts) still reaches the
# names that lived here before the module was split; new code imports them from their modules.
from moesim.traces.tracer.arch import supported_architectures as supported_architectures
from moesim.traces.tracer.model_loading import load_model as load_model
from moesim.traces.tracer.prompts import read_prompts as read_prompts

TRACER_VERSION = 1
"""Version of the tracer, written to a trace's provenance (``source.tracer``)."""


# --------------------------------------------------------------------------------------------
# Driving the model


def _stop_ids(model: nn.Module) -> tuple[int, ...]:
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = getattr(model_config(model), "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))


def request_generator(seed: int, request_id: int, device: torch.device | str) -> torch.Generator:
    """The sampling generator of one request: seeded from ``(seed, request_id)`` so that a
    request samples the same tokens whatever other requests run (no global RNG state)."""
    state = int(np.random.SeedSequence([seed, request_id]).generate_state(1, dtype=np.uint64)[0])
    g = torch.Generator(device=device)
    g.manual_seed(state & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def generate_ids(
    model: nn.Module,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    sample: bool = False,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    stop_token_ids: Sequence[int] = (),
) -> list[int]:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` (batch 1, KV cache) and
    return them. The prompt is one model call; each further token one call with the last
    token. Used by the tracer (its recorder takes the first call as the prefill, each later
    call as one decode step) and, without hooks, as the benchmark's baseline."""
    if not prompt:
        raise MoesimError("empty prompt: at least one token is needed")
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    if sample and temperature <= 0:
        raise ValueError("temperature must be > 0 when sampling")
    device = next(model.parameters()).device
    stops = set(stop_token_ids)
    out_ids: list[int] = []
    with torch.inference_mode():
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        for step in range(max_new_tokens):
            logits = out.logits[:, -1, :].float()
            if sample:
                probs = (logits / temperature).softmax(dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            else:
                nxt = logits.argmax(dim=-1, keepdim=True)
            tok = int(nxt.item())  # one sync per step, as in transformers' generate
            out_ids.append(tok)
            if step == max_new_tokens - 1 or tok in stops:
                break
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    return out_ids


class Tracer:
    """Runs prompts through a model with routing recording (and optional timers) attached.

    ``with Tracer(model) as t: rec = t.generate(prompt_ids, max_new_tokens=32)``.
    The model is put in eval mode. Hooks come off on :meth:`close`.
    """

    def __init__(self, model: nn.Module, *, columns: Iterable[str] = ALL_OPTIONAL,
                 timers: Sequence[CallTimer] = ()) -> None:
        self.model = model.eval()
        self.registry = HookRegistry(model)
        try:
            self.recorder = RoutingRecorder(self.registry, columns=columns)
            for t in timers:
                self.registry.add_timer(t)
        except BaseException:
            self.registry.remove()
            raise

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def model_info(self, name: str) -> ModelInfo:
        """The trace's model block: L = MoE layers found, E, k, shared experts."""
        cfg = model_config(self.model)
        return ModelInfo(name=name, num_layers=self.recorder.num_layers,
                         num_experts=self.recorder.num_experts, top_k=self.recorder.top_k,
                         num_shared_experts=self.registry.arch.shared_experts(cfg))

    def routing_description(self) -> str:
        return self.registry.rules[0].describe(self.registry.layers[0].router)

    def generate(self, prompt: Sequence[int], *, max_new_tokens: int, sample: bool = False,
                 temperature: float = 1.0, generator: torch.Generator | None = None,
                 stop_token_ids: Sequence[int] = ()) -> tuple[RequestRecord, list[int]]:
        """Generation mode: returns the request's routing and the generated token ids."""
        try:
            new = generate_ids(self.model, prompt, max_new_tokens=max_new_tokens, sample=sample,
                               temperature=temperature, generator=generator,
                               stop_token_ids=stop_token_ids)
        except BaseException:
            self.recorder.abort()
            raise
        return self.recorder.finish_request(), new

    def teacher_forced(self, prompt: Sequence[int], completion: Sequence[int] | None = None) -> RequestRecord:
        """Teacher-forced mode: one forward over ``prompt + completion``. With a completion,
        the prompt is a prefill iteration and each completion token a decode iteration;
        without, every token is a decode iteration."""
        ids = list(prompt) + list(completion or [])
        if not ids:
            raise MoesimError("empty text: at least one token is needed")
        if completion:
            if not prompt:
                raise MoesimError("empty prompt before a completion")
            segments = [(len(prompt), PREFILL)] + [(1, DECODE)] * len(completion)
        else:
            segments = [(1, DECODE)] * len(ids)
        self.recorder.plan(segments)
        try:
            with torch.inference_mode():
                self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                           use_cache=False, logits_to_keep=1)
        except BaseException:
            self.recorder.abort()
            raise
        return self.recorder.finish_request()

    def close(self) -> None:
        self.registry.remove()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Whole traces


@dataclass
class TraceResult:
    """Columns ready for :func:`traces.format.write_trace`, the model block and provenance."""

    columns: dict[str, Any]
    model: ModelInfo
    source: dict[str, Any]
    generated: list[list[int]]

    @property
    def num_rows(self) -> int:
        return int(len(self.columns["request_id"]))


def build_columns(records: Sequence[RequestRecord], columns: Iterable[str] = ALL_OPTIONAL) -> dict[str, Any]:
    """Flatten request records into moe-trace rows (sorted by request, token, layer)."""
    cols = frozenset(columns)
    if not records:
        raise MoesimError("no requests to write")
    L, k = records[0].experts.shape[1:]
    T = np.array([r.num_tokens for r in records])
    rows = int(T.sum()) * L
    out: dict[str, Any] = {
        "request_id": np.repeat(np.arange(len(records), dtype=np.int32), T * L),
        "token_idx": np.concatenate([np.repeat(r.token_idx, L) for r in records]).astype(np.int32),
        "phase": np.concatenate([np.repeat(r.phase, L) for r in records]).astype(np.int8),
        "layer": np.tile(np.arange(L, dtype=np.int16), int(T.sum())),
        "experts": np.concatenate([r.experts.reshape(-1, k) for r in records]),
    }
    for name in ("weights", "logits", "lookahead_logits"):
        if name in cols and getattr(records[0], name) is not None:
            mats = [getattr(r, name) for r in records]
            out[name] = np.concatenate([m.reshape(m.shape[0] * L, -1) for m in mats])
    if "token_id" in cols:
        out["token_id"] = np.concatenate([np.repeat(r.token_id, L) for r in records]).astype(np.int32)
    if "embedding" in cols and records[0].iteration_embedding is not None:
        per_token = np.concatenate([r.iteration_embedding[r.token_iteration] for r in records])  # type: ignore[index]
        out["embedding"] = embedding_list_array(per_token, np.arange(0, rows, L), rows)  # layer-0 rows
    return out


@quiet_library_warnings()
def trace_model(
    model: nn.Module,
    prompts: Sequence[Prompt],
    *,
    name: str,
    teacher_forced: bool = False,
    max_new_tokens: int = 32,
    sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    stop_at_eos: bool = True,
    columns: Iterable[str] = ALL_OPTIONAL,
    timers: Sequence[CallTimer] = (),
    progress: Callable[[int], None] | None = None,
) -> TraceResult:
    """Trace every prompt (request ``i`` = ``prompts[i]``) and return the trace's columns.

    Generation (default) or teacher forcing, as the module docstring describes; in generation
    mode a prompt carrying a completion is an error (it would otherwise be ignored).
    ``stop_at_eos`` ends a generation at the model's EOS token(s). ``progress(i)`` is called
    after request ``i``. The source block records the tracer, library versions, routing rule,
    mode and generation parameters.
    """
    cols = frozenset(columns)
    records: list[RequestRecord] = []
    generated: list[list[int]] = []
    with Tracer(model, columns=cols, timers=timers) as tracer:
        stops = _stop_ids(model) if stop_at_eos else ()
        for i, prompt in enumerate(prompts):
            if teacher_forced:
                records.append(tracer.teacher_forced(prompt.input_ids, prompt.completion_ids))
                generated.append([])
            else:
                if prompt.completion_ids is not None:
                    raise MoesimError(f"prompt {i} has a completion: that is teacher forcing "
                                      "(use --teacher-forced)")
                gen = request_generator(seed, i, tracer.device) if sample else None
                rec, new = tracer.generate(prompt.input_ids, max_new_tokens=max_new_tokens,
                                           sample=sample, temperature=temperature,
                                           generator=gen, stop_token_ids=stops)
                records.append(rec)
                generated.append(new)
            if progress:
                progress(i)
        info = tracer.model_info(name)
        routing = tracer.routing_description()
        arch = tracer.registry.arch.name
    source: dict[str, Any] = {
        "tracer": f"moesim traces.tracer v{TRACER_VERSION}",
        "torch": torch.__version__,
        "model_class": type(model).__name__,
        "architecture": arch,
        "routing": routing,
        "experts_order": "highest selection score first",
        "weights": "softmax over all E of the router logits, not renormalised",
        "mode": "teacher-forced" if teacher_forced else "generation",
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": str(next(model.parameters()).device),
    }
    if teacher_forced:
        source["rows"] = ("prompt tokens one prefill iteration, completion tokens one decode "
                          "iteration each; a text without completion: decode rows only")
    else:
        source.update(max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos, seed=seed,
                      sampling=f"sample (temperature {temperature})" if sample else "greedy")
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        source["moesim"] = importlib.metadata.version("moesim")
    tf = sys.modules.get("transformers")
    if tf is not None:
        source["transformers"] = getattr(tf, "__version__", "?")
    return TraceResult(columns=build_columns(records, cols), model=info, source=source, generated=generated)


def record_trace(out: str | Path, result: TraceResult, *, extra_source: dict[str, Any] | None = None) -> Path:
    """Validate and write ``result`` to ``out`` (atomically, see :func:`write_trace`)."""
    meta = TraceMeta(model=result.model, source={**result.source, **(extra_source or {})})
    return write_trace(out, result.columns, meta)
