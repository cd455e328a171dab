"""Record moe-trace v1 files from Hugging Face transformers MoE models (extra ``tracer``).

This is the only moesim module that imports torch (and, lazily, transformers); nothing else
imports it at import time.

How it works
------------
:class:`HookRegistry` finds the MoE layers of a model **by module type**: the
:data:`ARCHITECTURES` table maps each supported decoder-layer class and its sparse-MoE-block
class to the router attribute and its routing rule. Decoder layers whose MLP is dense (e.g.
DeepSeek's ``first_k_dense_replace`` layers, Qwen2-MoE ``mlp_only_layers``) are not counted:
MoE layers are numbered ``0..L-1`` in model order. A model with no supported router raises a
:class:`~sim.errors.MoesimError` naming its class. Supported: Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, Phi-MoE, DeepSeek-V2, DeepSeek-V3, GLM-4-MoE and GPT-OSS, as written in transformers 5
(routers returning ``(logits, weights, indices)``); :func:`supported_architectures` says which
the installed transformers provides.

:class:`RoutingRecorder` hangs a forward hook on every router and one on the input
embedding. Per token and MoE layer it records:

``experts``
    the model's own top-k: the expert ids the router returned (the router itself applies the
    architecture's rule: softmax-then-top-k, top-k-then-softmax, grouped top-k, bias
    correction), ordered highest selection score first. The selection score is the softmax
    probability (= the logit order) for softmax routers, ``sigmoid(logit) + e_score_correction_bias``
    for DeepSeek-V3/GLM-4-MoE, the logit for GPT-OSS and Phi-MoE. Routers that return logits
    only (older transformers releases) are routed by :meth:`RoutingRule.select`.
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

The recorder works with any driver that feeds one sequence (batch size 1) per forward,
including ``model.generate``: without an explicit plan, the first forward of a request is
its prefill and every later forward one decode iteration.

Calibration hooks
-----------------
:meth:`HookRegistry.add_timer` wraps the attention, router and expert calls of every layer in
``timer.start(kind, index)`` / ``timer.stop(kind, index)`` calls (a :class:`CallTimer`, for
instance one recording CUDA events). Timer stop hooks run before the recording hook, so
tracer work is not timed as router time. Hook order within one forward::

    embedding hook (recorder: new iteration)
    for each decoder layer d (dense layers included):
        timer.start("attention", d); self_attn; timer.stop("attention", d)
        if the layer is MoE layer l:
            timer.start("router", l); router; timer.stop("router", l); recorder(l)
            timer.start("experts", l); experts; timer.stop("experts", l)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moesim.sim.errors import MoesimError
from moesim.traces.format import (
    DECODE,
    OPTIONAL_COLUMNS,
    PREFILL,
    ModelInfo,
    TraceMeta,
    embedding_list_array,
    write_trace,
)

TRACER_VERSION = 1
ALL_OPTIONAL = frozenset(OPTIONAL_COLUMNS)

# --------------------------------------------------------------------------------------------
# Routing rules


@dataclass(frozen=True)
class RoutingRule:
    """How a router turns its logits ``[N, E]`` into its top-k experts.

    ``scoring``: ``"softmax"`` (probabilities = softmax over all E; its top-k is the top-k of
    the logits), ``"sigmoid"`` (DeepSeek-V3 scores ``sigmoid(logit)``), or ``"logits"``
    (top-k of the raw logits, the k weights then softmaxed: GPT-OSS's top-k-then-softmax and
    Phi-MoE's sparsemixer at inference). ``bias_attr`` names a router buffer added to the
    scores for selection only (``e_score_correction_bias``). ``group_reduce`` enables grouped
    top-k: experts split into ``router.num_group`` equal groups, each scored by the ``"max"``
    or the ``"top2_sum"`` of its members' selection scores, only the ``router.topk_group``
    best groups eligible. ``renormalise`` documents how the model mixes the k experts
    (``"always"``, ``"never"`` or the router attribute that decides, e.g.
    ``"norm_topk_prob"``, or ``"n/a"`` where the weights are a softmax over the k anyway); it
    changes the model's mixing weights, never which experts run.
    """

    name: str
    scoring: str
    bias_attr: str | None = None
    group_reduce: str | None = None
    renormalise: str = "never"

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid", "logits"):
            raise ValueError(f"unknown scoring {self.scoring!r}")
        if self.group_reduce not in (None, "max", "top2_sum"):
            raise ValueError(f"unknown group_reduce {self.group_reduce!r}")

    def router_bias(self, router: nn.Module) -> torch.Tensor | None:
        """The router's selection bias ``[E]`` (``bias_attr``), or None."""
        bias = getattr(router, self.bias_attr, None) if self.bias_attr else None
        return bias if isinstance(bias, torch.Tensor) else None

    def selection_scores(self, logits: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 scores (shape of ``logits``, experts last) whose top-k, after group
        masking, the model selects; ``bias`` (``[E]`` or broadcastable) is added for selection."""
        x = logits.float()
        if self.scoring == "softmax":
            s = x.softmax(dim=-1)
        elif self.scoring == "sigmoid":
            s = x.sigmoid()
        else:
            s = x
        return s if bias is None else s + bias.float()

    def select(self, logits: torch.Tensor, router: nn.Module, k: int) -> torch.Tensor:
        """The top-k expert ids ``[N, k]`` (int64, highest selection score first) of
        ``logits [N, E]``; used for routers that return bare logits."""
        s = self.selection_scores(logits, self.router_bias(router))
        if self.group_reduce is not None:
            r: Any = router
            n_group, topk_group = int(r.num_group), int(r.topk_group)
            n, e = s.shape
            grouped = s.view(n, n_group, e // n_group)
            if self.group_reduce == "max":
                group_scores = grouped.max(dim=-1).values
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            keep = group_scores.topk(topk_group, dim=-1).indices
            mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            s = s.masked_fill(~mask.repeat_interleave(e // n_group, dim=1), float("-inf"))
        return s.topk(k, dim=-1).indices

    def describe(self, router: nn.Module) -> str:
        """One line for the trace's provenance, e.g. ``softmax top-k, renormalised``."""
        parts = [self.name]
        if self.group_reduce is not None:
            parts.append(f"{getattr(router, 'num_group', '?')} groups, best "
                         f"{getattr(router, 'topk_group', '?')} by {self.group_reduce}")
        if self.renormalise == "n/a":
            pass
        elif self.renormalise in ("always", "never"):
            parts.append("renormalised over the k" if self.renormalise == "always" else "not renormalised")
        else:
            flag = bool(getattr(router, self.renormalise, False))
            parts.append(f"{self.renormalise}={flag}")
        return ", ".join(parts)


SOFTMAX_TOPK = RoutingRule("softmax over E then top-k", "softmax", renormalise="norm_topk_prob")
SOFTMAX_TOPK_RENORM = RoutingRule("softmax over E then top-k", "softmax", renormalise="always")
SOFTMAX_GROUPED = RoutingRule("softmax over E, group-limited greedy top-k", "softmax", group_reduce="max")
SOFTMAX_GREEDY = RoutingRule("softmax over E then top-k", "softmax")
SIGMOID_GROUPED = RoutingRule(
    "sigmoid scores + e_score_correction_bias, grouped top-k", "sigmoid",
    bias_attr="e_score_correction_bias", group_reduce="top2_sum", renormalise="norm_topk_prob",
)
TOPK_THEN_SOFTMAX = RoutingRule("top-k of logits then softmax over the k", "logits", renormalise="n/a")
SPARSEMIXER = RoutingRule("sparsemixer (inference: top-1, then top-1 of the rest)", "logits",
                          renormalise="n/a")


def _deepseek_v2_rule(router: nn.Module) -> RoutingRule:
    method = getattr(router, "topk_method", "greedy")
    if method == "greedy":
        return SOFTMAX_GREEDY
    if method == "group_limited_greedy":
        return SOFTMAX_GROUPED
    raise MoesimError(f"DeepSeek-V2 router: unsupported topk_method {method!r} "
                      "(supported: greedy, group_limited_greedy)")


# --------------------------------------------------------------------------------------------
# Architecture table


def _no_shared(config: Any) -> int:
    return 0


def _qwen2_shared(config: Any) -> int:
    return 1 if int(getattr(config, "shared_expert_intermediate_size", 0) or 0) > 0 else 0


def _deepseek_shared(config: Any) -> int:
    return int(getattr(config, "n_shared_experts", 0) or 0)


@dataclass(frozen=True)
class ArchSpec:
    """One supported MoE architecture: where its router sits and how it routes.

    A decoder layer (``layer_class``) is a MoE layer when its ``block_attr`` child is a
    ``block_class``; the router is ``block.<router_attr>``, the experts ``block.<experts_attr>``,
    the attention ``layer.<attention_attr>``. Classes are looked up in ``module`` (only once
    that module is imported, i.e. once a model of that type exists). ``linear_router`` says
    the router's logits are ``F.linear(x, weight, bias)`` in the logits' dtype, so the
    lookahead logits can be computed without calling the router module (checked by the
    tests against the module itself); otherwise the module's ``forward`` is called.
    ``fixed_top_k`` overrides the config's ``num_experts_per_tok`` (Phi-MoE's sparsemixer
    always picks 2).
    """

    name: str
    model_type: str
    module: str
    layer_class: str
    block_class: str
    rule: Callable[[nn.Module], RoutingRule]
    num_experts_keys: tuple[str, ...]
    block_attr: str = "mlp"
    router_attr: str = "gate"
    experts_attr: str = "experts"
    attention_attr: str = "self_attn"
    shared_experts: Callable[[Any], int] = _no_shared
    fixed_top_k: int | None = None
    linear_router: bool = True

    def classes(self) -> tuple[type, type] | None:
        """``(layer_class, block_class)`` if their module is already imported, else None."""
        mod = sys.modules.get(self.module)
        if mod is None:
            return None
        layer, block = getattr(mod, self.layer_class, None), getattr(mod, self.block_class, None)
        if not (isinstance(layer, type) and isinstance(block, type)):
            return None
        return layer, block

    def available(self) -> bool:
        """Whether the installed transformers provides this architecture (imports it)."""
        try:
            if importlib.util.find_spec(self.module) is None:
                return False
            mod = importlib.import_module(self.module)
        except Exception:  # a broken optional import inside transformers counts as absent
            return False
        return hasattr(mod, self.layer_class) and hasattr(mod, self.block_class)


def _arch(name: str, model_type: str, prefix: str, layer: str, block: str, **kw: Any) -> ArchSpec:
    return ArchSpec(name=name, model_type=model_type,
                    module=f"transformers.models.{model_type}.modeling_{model_type}",
                    layer_class=f"{prefix}{layer}", block_class=f"{prefix}{block}", **kw)


ARCHITECTURES: tuple[ArchSpec, ...] = (
    _arch("Mixtral", "mixtral", "Mixtral", "DecoderLayer", "SparseMoeBlock",
          rule=lambda r: SOFTMAX_TOPK_RENORM, num_experts_keys=("num_local_experts",)),
    _arch("Qwen2-MoE", "qwen2_moe", "Qwen2Moe", "DecoderLayer", "SparseMoeBlock",
          rule=lambda r: SOFTMAX_TOPK, num_experts_keys=("num_experts",), shared_experts=_qwen2_shared),
    _arch("Qwen3-MoE", "qwen3_moe", "Qwen3Moe", "DecoderLayer", "SparseMoeBlock",
          rule=lambda r: SOFTMAX_TOPK, num_experts_keys=("num_experts",)),
    _arch("OLMoE", "olmoe", "Olmoe", "DecoderLayer", "SparseMoeBlock",
          rule=lambda r: SOFTMAX_TOPK, num_experts_keys=("num_experts",)),
    _arch("Phi-MoE", "phimoe", "Phimoe", "DecoderLayer", "SparseMoeBlock", router_attr="router",
          rule=lambda r: SPARSEMIXER, num_experts_keys=("num_local_experts",), fixed_top_k=2),
    _arch("DeepSeek-V2", "deepseek_v2", "DeepseekV2", "DecoderLayer", "Moe",
          rule=_deepseek_v2_rule, num_experts_keys=("n_routed_experts", "num_experts"),
          shared_experts=_deepseek_shared),
    _arch("DeepSeek-V3", "deepseek_v3", "DeepseekV3", "DecoderLayer", "MoE",
          rule=lambda r: SIGMOID_GROUPED, num_experts_keys=("n_routed_experts", "num_local_experts"),
          shared_experts=_deepseek_shared),
    _arch("GLM-4-MoE", "glm4_moe", "Glm4Moe", "DecoderLayer", "MoE",
          rule=lambda r: SIGMOID_GROUPED, num_experts_keys=("n_routed_experts", "num_local_experts"),
          shared_experts=_deepseek_shared),
    _arch("GPT-OSS", "gpt_oss", "GptOss", "DecoderLayer", "MLP", router_attr="router",
          rule=lambda r: TOPK_THEN_SOFTMAX, num_experts_keys=("num_local_experts",)),
)


def supported_architectures() -> dict[str, bool]:
    """``{name: provided by the installed transformers}`` for every table entry."""
    return {spec.name: spec.available() for spec in ARCHITECTURES}


# --------------------------------------------------------------------------------------------
# Hook registry


class CallTimer(Protocol):
    """Receives a start and a stop call around each timed module call.

    ``kind`` is ``"attention"`` (``index`` = decoder layer, dense ones included),
    ``"router"`` or ``"experts"`` (``index`` = MoE layer). The calibration harness implements
    this with CUDA events; the tracer itself never times anything.
    """

    def start(self, kind: str, index: int) -> None: ...

    def stop(self, kind: str, index: int) -> None: ...


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer of a model: its index ``0..L-1`` among MoE layers, its index among all
    decoder layers, and the modules a tracer or a timer hooks."""

    index: int
    decoder_index: int
    decoder_layer: nn.Module
    block: nn.Module
    router: nn.Module
    experts: nn.Module | None
    attention: nn.Module | None


def _model_config(model: nn.Module) -> Any:
    return getattr(model, "config", None)


def find_moe_layers(model: nn.Module) -> tuple[ArchSpec, list[MoeLayer], list[nn.Module]]:
    """Find the architecture, the MoE layers (in model order) and all decoder layers.

    Raises :class:`MoesimError` naming the model class when no supported router is found.
    """
    for spec in ARCHITECTURES:
        classes = spec.classes()
        if classes is None:
            continue
        layer_cls, block_cls = classes
        decoders = [m for m in model.modules() if isinstance(m, layer_cls)]
        if not decoders:
            continue
        layers: list[MoeLayer] = []
        for d, dec in enumerate(decoders):
            block = getattr(dec, spec.block_attr, None)
            if not isinstance(block, block_cls):
                continue  # a dense decoder layer: not counted
            router = getattr(block, spec.router_attr, None)
            weight = getattr(router, "weight", None)
            if not isinstance(router, nn.Module) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                raise MoesimError(f"{type(model).__name__}: {spec.block_class}.{spec.router_attr} "
                                  "is not a router with a [num_experts, hidden] weight")
            experts = getattr(block, spec.experts_attr, None)
            attention = getattr(dec, spec.attention_attr, None)
            layers.append(MoeLayer(
                index=len(layers), decoder_index=d, decoder_layer=dec, block=cast(nn.Module, block), router=router,
                experts=experts if isinstance(experts, nn.Module) else None,
                attention=attention if isinstance(attention, nn.Module) else None,
            ))
        stray = sum(isinstance(m, block_cls) for m in model.modules()) - len(layers)
        if stray:
            raise MoesimError(f"{type(model).__name__}: {stray} {spec.block_class} module(s) "
                              f"outside {spec.layer_class}.{spec.block_attr}; layout not supported")
        if not layers:
            raise MoesimError(f"{type(model).__name__}: {spec.name} model without any MoE layer "
                              "(every decoder layer is dense)")
        return spec, layers, decoders
    names = ", ".join(s.name for s in ARCHITECTURES)
    raise MoesimError(f"{type(model).__name__}: no supported MoE router found "
                      f"(the tracer supports {names})")


RouterHook = Callable[[int, torch.Tensor, Any], None]
EmbeddingHook = Callable[[torch.Tensor, torch.Tensor], None]


class HookRegistry:
    """Owns every hook the tracer and timers put on a model, so they all come off together.

    Construction finds the MoE layers (:func:`find_moe_layers`) and attaches nothing. Use as
    a context manager, or call :meth:`remove`.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.arch, self.layers, self.decoder_layers = find_moe_layers(model)
        getter = getattr(model, "get_input_embeddings", None)
        emb = getter() if callable(getter) else None
        if not isinstance(emb, nn.Module):
            raise MoesimError(f"{type(model).__name__}: no input embedding module")
        self.embedding: nn.Module = emb
        self.rules = [self.arch.rule(layer.router) for layer in self.layers]
        self._handles: list[Any] = []

    @property
    def routers(self) -> list[nn.Module]:
        return [layer.router for layer in self.layers]

    def on_router(self, fn: RouterHook) -> None:
        """Call ``fn(moe_layer, router_input, router_output)`` after every router call;
        ``router_input`` is the router's first argument as given (``[..., hidden]``)."""
        for layer in self.layers:
            def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                     _l: int = layer.index) -> None:
                x = args[0] if args else kwargs.get("hidden_states")
                if not isinstance(x, torch.Tensor):
                    raise MoesimError(f"router of MoE layer {_l} called without a hidden-states tensor")
                fn(_l, x, output)
            self._handles.append(layer.router.register_forward_hook(hook, with_kwargs=True))

    def on_embedding(self, fn: EmbeddingHook) -> None:
        """Call ``fn(input_ids, embeddings)`` after every input-embedding call (once per
        forward: it marks the start of a model call)."""
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            fn(args[0], output)
        self._handles.append(self.embedding.register_forward_hook(hook))

    def add_timer(self, timer: CallTimer, kinds: Iterable[str] = ("attention", "router", "experts")) -> None:
        """Wrap the chosen module calls in ``timer.start``/``timer.stop`` (see :class:`CallTimer`)."""
        targets: list[tuple[str, int, nn.Module]] = []
        wanted = set(kinds)
        unknown = wanted - {"attention", "router", "experts"}
        if unknown:
            raise ValueError(f"unknown timer kind(s): {', '.join(sorted(unknown))}")
        if "attention" in wanted:
            for d, dec in enumerate(self.decoder_layers):
                att = getattr(dec, self.arch.attention_attr, None)
                if isinstance(att, nn.Module):
                    targets.append(("attention", d, att))
        for layer in self.layers:
            if "router" in wanted:
                targets.append(("router", layer.index, layer.router))
            if "experts" in wanted and layer.experts is not None:
                targets.append(("experts", layer.index, layer.experts))
        for kind, index, module in targets:
            def pre(module: nn.Module, args: Any, _k: str = kind, _i: int = index) -> None:
                timer.start(_k, _i)

            def post(module: nn.Module, args: Any, output: Any, _k: str = kind, _i: int = index) -> None:
                timer.stop(_k, _i)
            self._handles.append(module.register_forward_pre_hook(pre))
            # prepend: the stop runs before the recorder's hook, so tracer work is not timed
            self._handles.append(module.register_forward_hook(post, prepend=True))

    def remove(self) -> None:
        """Detach every hook this registry attached (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> HookRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# --------------------------------------------------------------------------------------------
# Recording


@dataclass
class RequestRecord:
    """The routing of one request, as numpy arrays (T tokens, L MoE layers, k, E, D).

    ``token_idx`` ``[T]`` int32 (0.. in order), ``phase`` ``[T]`` int8 (0 prefill, 1 decode),
    ``token_id`` ``[T]`` int32, ``experts`` ``[T, L, k]`` int16, ``weights`` ``[T, L, k]``
    float32, ``logits``/``lookahead_logits`` ``[T, L, E]`` float16, ``iteration_embedding``
    ``[S, D]`` float16 for the S iterations, ``token_iteration`` ``[T]`` the iteration of
    each token. Columns not recorded are None.
    """

    token_idx: np.ndarray
    phase: np.ndarray
    token_id: np.ndarray
    experts: np.ndarray
    weights: np.ndarray | None
    logits: np.ndarray | None
    lookahead_logits: np.ndarray | None
    iteration_embedding: np.ndarray | None
    token_iteration: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.token_idx.shape[0])


@dataclass
class _Forward:
    """State of one model call being recorded (device tensors until the call closes)."""

    n: int
    token_ids: torch.Tensor
    phases: list[int]                      # per token
    token_iteration: np.ndarray            # per token, request-level iteration index
    iteration_embedding: torch.Tensor | None
    logits: list[torch.Tensor] = field(default_factory=list)        # per layer [n, E]
    chosen: list[torch.Tensor] = field(default_factory=list)        # per layer [n, k]
    ahead: list[torch.Tensor] = field(default_factory=list)         # per layer [n, E]


class RoutingRecorder:
    """Records per-token routing from the hooks of a :class:`HookRegistry`.

    Driver protocol (per request)::

        recorder.plan([(num_tokens, phase), ...])   # optional, before each model call
        model(...)                                    # hooks record
        ... more calls ...
        record = recorder.finish_request()

    Without a plan, the first call of a request is one prefill iteration and each later call
    one decode iteration. Only batch size 1 is supported. ``columns`` picks the optional
    columns to record (skipping ``lookahead_logits`` saves one matmul per layer).

    Cost: a router hook keeps references to the router's logits and choice and, for
    ``lookahead_logits``, runs one ``[n, H] x [H, E]`` matmul; ordering, probabilities and
    casts run once per model call over all layers stacked; the host copy happens once per
    request. Nothing synchronises the GPU before :meth:`finish_request`.
    """

    def __init__(self, registry: HookRegistry, *, columns: Iterable[str] = ALL_OPTIONAL) -> None:
        cols = frozenset(columns)
        unknown = cols - ALL_OPTIONAL
        if unknown:
            raise ValueError(f"unknown optional column(s): {', '.join(sorted(unknown))}")
        self.columns = cols
        self.registry = registry
        self.num_layers = len(registry.layers)
        arch = registry.arch
        cfg = _model_config(registry.model)
        self.top_k = _top_k(arch, cfg, registry.layers[0].router)
        widths = {int(_router_weight(layer.router).shape[0]) for layer in registry.layers}
        if len(widths) != 1:
            raise MoesimError(f"{arch.name}: routers of different widths {sorted(widths)}")
        self.num_experts = widths.pop()
        for key in arch.num_experts_keys:
            declared = getattr(cfg, key, None)
            if isinstance(declared, int) and declared != self.num_experts:
                raise MoesimError(f"{arch.name}: config {key}={declared} but the routers have "
                                  f"{self.num_experts} experts")
        if self.top_k > self.num_experts:
            raise MoesimError(f"{arch.name}: top_k={self.top_k} exceeds {self.num_experts} experts")
        self.rule = registry.rules[0]
        if any(r != self.rule for r in registry.rules):
            raise MoesimError(f"{arch.name}: MoE layers with different routing rules")
        self._routers = registry.routers
        self._ahead_cache: dict[tuple[int, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._plan: list[tuple[int, int]] | None = None
        self._fwd: _Forward | None = None
        self._reset_request()
        registry.on_embedding(self._on_embedding)
        registry.on_router(self._on_router)

    # -- request state
    def _reset_request(self) -> None:
        self._next_token = 0
        self._next_iteration = 0
        self._stacked: list[dict[str, Any]] = []

    def abort(self) -> None:
        """Drop everything recorded for the current request (after a failed model call)."""
        self._plan = None
        self._fwd = None
        self._reset_request()

    def plan(self, segments: Sequence[tuple[int, int]]) -> None:
        """Declare the iterations of the next model call: ``(num_tokens, phase)`` in token
        order, ``phase`` 0 = prefill, 1 = decode."""
        if not segments or any(n < 1 or p not in (PREFILL, DECODE) for n, p in segments):
            raise ValueError(f"bad forward plan {segments!r}")
        self._plan = list(segments)

    # -- hooks
    def _on_embedding(self, input_ids: Any, embeds: Any) -> None:
        self._close_forward()
        if not isinstance(input_ids, torch.Tensor) or not isinstance(embeds, torch.Tensor):
            raise MoesimError("the tracer needs the model called with input_ids (not inputs_embeds)")
        if input_ids.dim() == 2 and input_ids.shape[0] != 1:
            raise MoesimError(f"the tracer records one sequence per call (batch size 1), got batch {input_ids.shape[0]}")
        ids = input_ids.reshape(-1)
        n = int(ids.numel())
        if self._plan is not None:
            segments, self._plan = self._plan, None
        else:
            segments = [(n, PREFILL if self._next_token == 0 else DECODE)]
        lengths = [s for s, _ in segments]
        if sum(lengths) != n:
            raise MoesimError(f"model call with {n} tokens, but the plan covers {sum(lengths)}")
        if self._next_token and any(p == PREFILL for _, p in segments):
            raise MoesimError("a prefill iteration after the first model call of a request")
        local = np.repeat(np.arange(len(segments)), lengths)
        emb: torch.Tensor | None = None
        if "embedding" in self.columns:
            with torch.no_grad():
                flat = embeds.reshape(n, -1).float()
                if len(segments) == 1:
                    emb = flat.mean(dim=0, keepdim=True)
                elif len(segments) == n:
                    emb = flat
                else:
                    index = torch.from_numpy(local).to(flat.device)
                    sums = torch.zeros(len(segments), flat.shape[1], device=flat.device).index_add_(0, index, flat)
                    emb = sums / torch.tensor(lengths, device=flat.device, dtype=sums.dtype)[:, None]
        self._fwd = _Forward(n=n, token_ids=ids, phases=[p for s, p in segments for _ in range(s)],
                             token_iteration=local + self._next_iteration, iteration_embedding=emb)
        self._next_iteration += len(segments)

    def _ahead_weight(self, layer: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight and bias of the router after ``layer``, cast once to the logits' dtype."""
        key = (layer, dtype, device)
        hit = self._ahead_cache.get(key)
        if hit is None:
            nxt = self._routers[(layer + 1) % self.num_layers]
            bias = getattr(nxt, "bias", None)
            hit = (_router_weight(nxt).detach().to(device=device, dtype=dtype),
                   bias.detach().to(device=device, dtype=dtype) if isinstance(bias, torch.Tensor) else None)
            self._ahead_cache[key] = hit
        return hit

    def _on_router(self, layer: int, x: torch.Tensor, output: Any) -> None:
        fwd = self._fwd
        if fwd is None:
            raise MoesimError(f"router of MoE layer {layer} ran outside a traced model call")
        if layer != len(fwd.logits):
            raise MoesimError(f"router of MoE layer {layer} ran out of order (expected layer {len(fwd.logits)})")
        with torch.no_grad():
            x2 = x.reshape(-1, x.shape[-1])
            if x2.shape[0] != fwd.n:
                raise MoesimError(f"router of MoE layer {layer} saw {x2.shape[0]} tokens, the call has {fwd.n}")
            logits, idx = _split_router_output(output, layer)
            if idx is None:
                idx = self.rule.select(logits, self._routers[layer], self.top_k)
            if idx.shape[-1] != self.top_k:
                raise MoesimError(f"router of MoE layer {layer} chose {idx.shape[-1]} experts, expected top_k={self.top_k}")
            fwd.logits.append(logits)
            fwd.chosen.append(idx)
            if "lookahead_logits" in self.columns:
                if self.registry.arch.linear_router:
                    # the router's own computation (a linear map, in the logits' dtype), without
                    # calling the module: no hook or timer fires for it
                    w, b = self._ahead_weight(layer, logits.dtype, logits.device)
                    ahead = F.linear(x2.to(logits.dtype), w, b)
                else:
                    ahead, _ = _split_router_output(self._routers[(layer + 1) % self.num_layers].forward(x2), layer)
                fwd.ahead.append(ahead)

    def _close_forward(self) -> None:
        fwd, self._fwd = self._fwd, None
        if fwd is None:
            return
        if len(fwd.logits) != self.num_layers:
            raise MoesimError(f"a model call ran {len(fwd.logits)} of {self.num_layers} MoE routers")
        with torch.no_grad():
            logits = torch.stack(fwd.logits, dim=1)                    # [n, L, E]
            chosen = torch.stack(fwd.chosen, dim=1).long()             # [n, L, k]
            bias = None
            if self.rule.bias_attr is not None:
                biases = [self.rule.router_bias(r) for r in self._routers]
                if all(b is not None for b in biases):
                    bias = torch.stack(cast(list[torch.Tensor], biases))  # [L, E]
            rank = self.rule.selection_scores(logits, bias).gather(2, chosen)
            experts = chosen.gather(2, rank.sort(dim=2, descending=True, stable=True).indices)
            out: dict[str, Any] = {"experts": experts.to(torch.int16)}
            if "weights" in self.columns:
                out["weights"] = logits.float().softmax(dim=-1).gather(2, experts)
            if "logits" in self.columns:
                out["logits"] = logits.to(torch.float16)
            if "lookahead_logits" in self.columns:
                out["lookahead_logits"] = torch.stack(fwd.ahead, dim=1).to(torch.float16)
        out["token_id"] = fwd.token_ids
        if fwd.iteration_embedding is not None:
            out["iteration_embedding"] = fwd.iteration_embedding
        out["token_iteration"] = fwd.token_iteration
        out["phase"] = np.asarray(fwd.phases, dtype=np.int8)
        self._stacked.append(out)
        self._next_token += fwd.n

    def finish_request(self) -> RequestRecord:
        """Close the last model call and return the request's routing (one host copy per
        column); the recorder is then ready for the next request."""
        self._close_forward()
        if self._plan is not None:
            raise MoesimError("a forward plan was given but no model call followed")
        if not self._stacked:
            raise MoesimError("no model call was recorded for this request")

        def cat(name: str) -> np.ndarray | None:
            if name not in self._stacked[0]:
                return None
            parts = [s[name] for s in self._stacked]
            if isinstance(parts[0], np.ndarray):
                return np.concatenate(parts)
            return torch.cat(parts).cpu().numpy()

        experts = cat("experts")
        assert experts is not None
        emb = cat("iteration_embedding")
        rec = RequestRecord(
            token_idx=np.arange(experts.shape[0], dtype=np.int32),
            phase=np.asarray(cat("phase"), dtype=np.int8),
            token_id=np.asarray(cat("token_id"), dtype=np.int32),
            experts=experts,
            weights=cat("weights"),
            logits=cat("logits"),
            lookahead_logits=cat("lookahead_logits"),
            iteration_embedding=None if emb is None else emb.astype(np.float16),
            token_iteration=np.asarray(cat("token_iteration"), dtype=np.int64),
        )
        self._reset_request()
        return rec


def _router_weight(router: nn.Module) -> torch.Tensor:
    return cast(torch.Tensor, router.weight)


def _split_router_output(output: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logits [N, E], chosen ids [N, k] or None)`` from a router's return value: a
    ``(logits, weights, indices)`` tuple (transformers >= 5) or bare logits (older gates)."""
    if isinstance(output, torch.Tensor):
        return output.reshape(-1, output.shape[-1]), None
    if isinstance(output, tuple) and len(output) == 3 and all(isinstance(t, torch.Tensor) for t in output):
        logits, _, idx = output
        return logits.reshape(-1, logits.shape[-1]), idx.reshape(-1, idx.shape[-1]).long()
    raise MoesimError(f"router of MoE layer {layer} returned {type(output).__name__}; expected "
                      "logits or (logits, weights, indices)")


def _top_k(spec: ArchSpec, config: Any, router: nn.Module) -> int:
    if spec.fixed_top_k is not None:
        return spec.fixed_top_k
    k = getattr(config, "num_experts_per_tok", None) or getattr(router, "top_k", None)
    if k is None:
        raise MoesimError(f"{spec.name}: cannot tell top_k (no num_experts_per_tok in the config)")
    return int(k)


# --------------------------------------------------------------------------------------------
# Driving the model


def _stop_ids(model: nn.Module) -> tuple[int, ...]:
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = getattr(_model_config(model), "eos_token_id", None)
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
        cfg = _model_config(self.model)
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
# Prompts


@dataclass(frozen=True)
class Prompt:
    """One request: prompt token ids and, for teacher forcing, an optional completion."""

    input_ids: tuple[int, ...]
    completion_ids: tuple[int, ...] | None = None


PROMPT_KEYS = ("text", "input_ids", "completion", "completion_ids")


def byte_tokenize(text: str, vocab_size: int) -> list[int]:
    """The fallback tokenisation when a model has no tokenizer: the UTF-8 bytes of ``text``
    (ids 0..255), reduced modulo ``vocab_size`` when the vocabulary is smaller. Deterministic,
    no special tokens."""
    return [b % vocab_size for b in text.encode("utf-8")]


def read_prompts(path: str | Path, *, tokenizer: Any | None, vocab_size: int) -> tuple[list[Prompt], str]:
    """Read a prompts file into :class:`Prompt` records; returns them and how text was
    tokenised (``"tokenizer"``, ``"bytes"`` or ``"input_ids"``).

    ``*.jsonl`` files hold one JSON object per line with exactly one of ``text`` (string) or
    ``input_ids`` (list of ints) and optionally one of ``completion`` / ``completion_ids``
    (teacher-forced continuation); other keys are errors. Any other file is plain text, one
    prompt per line (blank lines skipped). Text goes through the model's tokenizer, or the
    byte fallback (:func:`byte_tokenize`) when the model has none.
    """
    p = Path(path)
    if not p.is_file():
        raise MoesimError(f"{p}: no such prompts file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise MoesimError(f"{p}: not UTF-8 text ({exc.reason})") from None
    used: set[str] = set()

    def tok(text: str, special: bool) -> list[int]:
        if tokenizer is not None:
            used.add("tokenizer")
            return list(tokenizer(text, add_special_tokens=special)["input_ids"])
        used.add("bytes")
        return byte_tokenize(text, vocab_size)

    def ids_of(val: Any, where: str, key: str) -> list[int]:
        if not isinstance(val, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in val):
            raise MoesimError(f"{where}: {key!r} must be a list of integers")
        bad = [v for v in val if not 0 <= v < vocab_size]
        if bad:
            raise MoesimError(f"{where}: {key!r} holds token id {bad[0]} outside 0..{vocab_size - 1}")
        used.add("input_ids")
        return list(val)

    prompts: list[Prompt] = []
    jsonl = p.suffix.lower() == ".jsonl"
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}, line {lineno}"
        if not jsonl:
            ids = tok(line, True)
            if not ids:
                raise MoesimError(f"{where}: the prompt has no tokens")
            prompts.append(Prompt(tuple(ids)))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MoesimError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise MoesimError(f"{where}: expected a JSON object")
        unknown = sorted(set(obj) - set(PROMPT_KEYS))
        if unknown:
            raise MoesimError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(PROMPT_KEYS)})")
        if ("text" in obj) == ("input_ids" in obj):
            raise MoesimError(f"{where}: give exactly one of 'text' or 'input_ids'")
        if "completion" in obj and "completion_ids" in obj:
            raise MoesimError(f"{where}: give at most one of 'completion' or 'completion_ids'")
        if "text" in obj:
            if not isinstance(obj["text"], str):
                raise MoesimError(f"{where}: 'text' must be a string")
            ids = tok(obj["text"], True)
        else:
            ids = ids_of(obj["input_ids"], where, "input_ids")
        completion: list[int] | None = None
        if "completion" in obj:
            if not isinstance(obj["completion"], str):
                raise MoesimError(f"{where}: 'completion' must be a string")
            completion = tok(obj["completion"], False)
        elif "completion_ids" in obj:
            completion = ids_of(obj["completion_ids"], where, "completion_ids")
        if not ids:
            raise MoesimError(f"{where}: the prompt has no tokens")
        prompts.append(Prompt(tuple(ids), None if completion is None else tuple(completion)))
    if not prompts:
        raise MoesimError(f"{p}: no prompts")
    return prompts, "+".join(sorted(used))


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


# --------------------------------------------------------------------------------------------
# Loading models


@dataclass
class LoadedModel:
    """A model ready to trace, its tokenizer (None when it has none), and provenance."""

    model: nn.Module
    tokenizer: Any | None
    name: str
    vocab_size: int
    source: dict[str, Any]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; a missing GPU is a one-line error."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise MoesimError(f"unknown device {device!r} (expected cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MoesimError(f"device {device!r} asked for, but this torch build sees no CUDA GPU")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """``None`` means float32 on CPU, bfloat16 on CUDA."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise MoesimError(f"unknown dtype {dtype!r} (expected {', '.join(DTYPES)})")
    return DTYPES[dtype]


def load_model(spec: str | Path, *, device: str = "cpu", dtype: str | None = None, seed: int = 0) -> LoadedModel:
    """Load a local model directory, or build one with random weights from a config.

    ``spec`` is a directory with ``config.json`` (and weights: loaded; without weights: the
    model is built from the config with random weights seeded by ``seed``), or a config JSON
    file (random weights). Nothing is downloaded: a non-local ``spec`` is an error.
    """
    import transformers

    path = Path(spec)
    if not path.exists():
        if _HUB_ID.match(str(spec)):
            raise MoesimError(f"model {str(spec)!r} is not a local path: the tracer has no network "
                              "access, download the model first and pass its local directory")
        raise MoesimError(f"{spec}: no such model directory or config file")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    src: dict[str, Any] = {"model_path": str(spec)}
    model: Any
    try:
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise MoesimError(f"{path}: a model directory needs a config.json")
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            has_weights = any((path / f).is_file() for f in _WEIGHT_FILES) or any(path.glob("*.safetensors"))
            name = path.resolve().name
        else:
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise MoesimError(f"{path}: not a JSON config ({exc})") from None
            if not isinstance(raw, dict) or "model_type" not in raw:
                raise MoesimError(f"{path}: a config JSON needs a 'model_type'")
            model_type = raw.pop("model_type")
            try:
                config = transformers.AutoConfig.for_model(model_type, **raw)
            except ValueError as exc:
                raise MoesimError(f"{path}: {str(exc).splitlines()[0]}") from None
            has_weights = False
            name = path.stem
        if has_weights:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=dt, local_files_only=True)
            src["weights"] = "pretrained"
        else:
            # seeded init on the target device, without touching the global RNG state
            rng_devices = [dev.index or 0] if dev.type == "cuda" else []
            with torch.random.fork_rng(devices=rng_devices), dev:
                torch.manual_seed(seed)
                model = transformers.AutoModelForCausalLM.from_config(config, dtype=dt)
            src["weights"] = f"random (seed {seed})"
    except MoesimError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MoesimError(f"{spec}: cannot build the model ({first})") from None
    model = model.to(dev).eval()
    tokenizer = None
    if path.is_dir() and any((path / f).is_file() for f in _TOKENIZER_FILES):
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise MoesimError(f"{path}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
    vocab = int(getattr(model.config, "vocab_size", 0) or model.get_input_embeddings().weight.shape[0])
    src.update(model_type=getattr(model.config, "model_type", "?"))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, vocab_size=vocab, source=src)
