"""The architecture table of the tracer: which transformers MoE models it can record, and how.

:class:`RoutingRule` describes how an architecture's router turns logits into the chosen
experts (used to route routers that return logits only, and written to a trace's provenance).
:data:`ARCHITECTURES` maps each supported decoder-layer class and its sparse-MoE-block class
to the router attribute and its routing rule. :func:`find_moe_layers` finds the MoE layers of
a model **by module type**: decoder layers whose MLP is dense (e.g. DeepSeek's
``first_k_dense_replace`` layers, Qwen2-MoE ``mlp_only_layers``) are not counted, so MoE
layers are numbered ``0..L-1`` in model order. A model with no supported router raises a
:class:`~sim.errors.MoesimError` naming its class. Supported: Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, Phi-MoE, DeepSeek-V2, DeepSeek-V3, GLM-4-MoE and GPT-OSS, as written in transformers 5
(routers returning ``(logits, weights, indices)``); :func:`supported_architectures` says which
the installed transformers provides.

Imports torch at import time: import it lazily (as :mod:`traces.tracer` is).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from moesim.sim.core.errors import MoesimError

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


def model_config(model: nn.Module) -> Any:
    """The model's transformers config (``model.config``), or None when it has none."""
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

