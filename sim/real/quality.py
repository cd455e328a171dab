"""The quality harness of lossy plans (extra ``tracer``): what a policy's plan does to a real
model's output distribution.

A lossy policy (CommitMoE's commitment, BuddyMoE's substitution, dynamic top-k) runs other
experts than the router chose; the simulator replays later routing as recorded and says nothing
of the output. This harness runs the plan on the model itself, teacher-forced on held-out text:

1. **record**: each text runs through the model once (one forward, no cache) with the tracer's
   hooks; every token is one decode iteration of its request (:meth:`Tracer.teacher_forced`
   without completion). Texts ``0..profile_texts-1`` form the ``profile:`` split (never
   evaluated), the others are evaluated.
2. **plan**: the policy replays the evaluated texts in the simulator (batch 1, decode only, the
   given hardware and cache budget, the profile split handed to ``setup``); every ``Plan`` it
   returns from ``on_routed`` is kept, per (text, token, layer).
3. **run**: each evaluated text runs twice, teacher-forced: unmodified (the reference) and with
   a forward hook on every router that replaces its choice by the plan where the policy gave one
   (``-1`` slots run nothing); elsewhere the model routes live, on its own perturbed hidden
   states. Combination weights: the plan's ``weights`` when it has them (router-probability
   scale, like the trace's ``weights`` column), multiplied per token by the factor the model
   itself applied to its routed top-k (1 for a model that does not renormalise, ``1 / sum`` of the
   routed probabilities for Mixtral); without them the router's softmax at the planned experts,
   normalised the same way.
4. **measure**, over every position of every evaluated text: ``kl`` = mean
   ``D_KL(p_ref || p_plan)`` of the next-token distributions (nats), ``agreement`` = share of
   positions whose argmax next token is unchanged, ``ppl_ref``/``ppl_plan`` = perplexity of the
   text's own next tokens, and ``ppl_delta`` their difference.

The model is an argument: a local Hugging Face model folder or config (:func:`load_model`), or
an ``nn.Module`` already built. Random weights make the harness's mechanics testable, not the
numbers meaningful: the paper's accuracy tables (GSM8K, BBH, ...) need the real checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moesim.policies.contract.base import Plan, Policy, Routing, View
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_hardware, get_model
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.lib_warnings import quiet_library_warnings
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.sim.run.profile import profile_from_trace
from moesim.traces.format.trace_file import Trace, TraceMeta, trace_from_columns
from moesim.traces.tracer.model_loading import load_model
from moesim.traces.tracer.prompts import Prompt
from moesim.traces.tracer.recorder import HookRegistry
from moesim.traces.tracer.tracer import trace_model

PlanRows = dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray | None]]
"""(request, token, layer) -> (planned experts ``[k]``, plan weights ``[k]`` or None)."""


@dataclass(frozen=True)
class QualityResult:
    """What a policy's plans did to the model (see the module docstring for each figure)."""

    policy: str
    texts: int                 # evaluated texts
    tokens: int                # evaluated positions
    kl: float                  # mean D_KL(p_ref || p_plan), nats
    agreement: float           # share of positions with the same argmax next token
    ppl_ref: float
    ppl_plan: float
    ppl_delta: float
    planned_token_layers: float  # share of evaluated token-layers the plan overrode
    sim: dict[str, Any] = field(default_factory=dict)  # the simulator's lossy metrics of the plan

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON)."""
        return asdict(self)


def resolve_model(model: str | Path | nn.Module, *, seed: int = 0) -> nn.Module:
    """An ``nn.Module`` as given, or the model at a local path (weights, or random ones from a
    config seeded by ``seed``)."""
    if isinstance(model, nn.Module):
        return model.eval()
    return load_model(model, seed=seed).model


@quiet_library_warnings()
def record_texts(model: nn.Module, texts: Sequence[Sequence[int]], name: str = "quality") -> Trace:
    """The routing of ``texts`` (token ids), teacher-forced, every token a decode iteration;
    request ``i`` is ``texts[i]``."""
    if not texts or any(len(t) < 2 for t in texts):
        raise MoesimError("quality: every text needs at least 2 tokens")
    res = trace_model(model, [Prompt(tuple(int(x) for x in t)) for t in texts], name=name, teacher_forced=True)
    return trace_from_columns(res.columns, TraceMeta(model=res.model, source=res.source))


def model_spec(model: nn.Module, trace: Trace) -> Any:
    """The simulator's model spec of ``model``: shapes from its config and the trace."""
    cfg: Any = getattr(model, "config", None)
    if cfg is None:
        raise MoesimError(f"{type(model).__name__}: a Hugging Face model with a config is needed")
    inter = getattr(cfg, "moe_intermediate_size", None) or getattr(cfg, "intermediate_size", None)
    if not inter:
        raise MoesimError(f"{type(model).__name__}: the config has no (moe_)intermediate_size")
    m = trace.model
    return get_model({"name": m.name, "num_layers": m.num_layers, "num_experts": m.num_experts,
                      "top_k": m.top_k, "hidden_size": int(cfg.hidden_size),
                      "expert_intermediate_size": int(inter),
                      "dtype_bytes": next(model.parameters()).element_size(), "non_expert_bytes": 0})


def simulate_plans(trace: Trace, policy: Policy, model: Any, *, profile_texts: int, hardware: str,
                   cache_rate: float, seed: int) -> tuple[PlanRows, dict[str, Any]]:
    """Replay the evaluated texts of ``trace`` under ``policy``; its plans and metrics."""
    L = trace.model.num_layers
    requests = list(range(int(trace.request_id.max()) + 1))
    profile = profile_from_trace(trace, requests[:profile_texts], "quality profile") if profile_texts else None
    wl = build_workload(trace, batch_size=1, phases=("decode",), requests=requests[profile_texts:])
    budget = int(round(cache_rate * L * model.num_experts)) * model.expert_bytes
    seen: list[tuple[int, int, Plan]] = []
    inner = policy.on_routed

    def spy(view: View, layer: int, routing: Routing) -> Plan | None:
        plan = inner(view, layer, routing)
        if plan is not None:
            seen.append((view.iteration_index, layer, plan))
        return plan

    policy.on_routed = spy  # type: ignore[method-assign]
    try:
        eng = Engine(wl, policy, CostModel(model, get_hardware(hardware)), budget_bytes=budget, seed=seed,
                     profile=profile, fast_replay=FAST_PATH)
        eng.run()
    finally:
        del policy.on_routed
    rows: PlanRows = {}
    for it, layer, plan in seen:
        tokens = wl.iterations[it].rows0
        for t, row0 in enumerate(tokens.tolist()):
            key = (int(trace.request_id[row0]), int(trace.token_idx[row0]), layer)
            w = None if plan.weights is None else np.asarray(plan.weights[t], dtype=np.float64)
            rows[key] = (np.asarray(plan.experts[t], dtype=np.int64), w)
    metrics = compute_metrics(eng.state)
    keep = ("routing_mass_kept", "substitutions_per_token", "dropped_per_token", "top1_agreement",
            "effective_top_k", "policy_report", "warnings")
    return rows, {k: metrics[k] for k in keep if k in metrics}


class PlanOverride:
    """Forward hooks on every router that replace its choice by the plan for the current text
    (``text`` is set before each forward). Router outputs must be ``(logits, weights, indices)``
    (transformers >= 5)."""

    def __init__(self, model: nn.Module, plans: PlanRows) -> None:
        self.registry = HookRegistry(model)
        self.plans = plans
        self.text = -1
        self.overridden = 0
        self._handles = [layer.router.register_forward_hook(self._hook(layer.index))
                         for layer in self.registry.layers]

    def _hook(self, layer: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if not (isinstance(output, tuple) and len(output) == 3):
                raise MoesimError(f"quality: router of MoE layer {layer} does not return "
                                  "(logits, weights, indices); this transformers version is not supported")
            logits, weights, index = output
            return self.apply(layer, logits, weights, index)
        return hook

    def apply(self, layer: int, logits: torch.Tensor, weights: torch.Tensor, index: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The router output with the planned rows of ``layer`` replaced."""
        lg = logits.reshape(-1, logits.shape[-1])
        n, k = index.shape[0], index.shape[-1]
        rows = {t: self.plans[(self.text, t, layer)] for t in range(n) if (self.text, t, layer) in self.plans}
        if not rows:
            return logits, weights, index
        width = max([k] + [len(e) for e, _ in rows.values()])
        idx = torch.zeros((n, width), dtype=index.dtype, device=index.device)
        w = torch.zeros((n, width), dtype=weights.dtype, device=weights.device)
        idx[:, :k], w[:, :k] = index, weights
        idx[:, k:] = index[:, :1]          # padding: an expert the token runs anyway, weight 0
        probs = torch.softmax(lg.float(), dim=-1)
        routed_ids = index.cpu().numpy()
        for t, (experts, pw) in rows.items():
            self.overridden += 1
            if pw is None and np.array_equal(experts, routed_ids[t]):
                continue                  # as routed: the model's own weights, bit for bit
            routed_p = probs[t, index[t]].sum()
            scale = float(weights[t].float().sum() / routed_p) if routed_p > 0 else 1.0
            valid = experts >= 0
            ids = torch.as_tensor(np.where(valid, experts, experts[valid][0] if valid.any() else 0),
                                  dtype=index.dtype, device=index.device)
            if pw is None:
                g = probs[t, ids] * torch.as_tensor(valid, device=probs.device)
            else:
                g = torch.as_tensor(np.where(valid, pw, 0.0), dtype=torch.float32, device=probs.device)
            idx[t, :] = ids[0] if len(ids) else 0
            w[t, :] = 0
            idx[t, : len(ids)] = ids
            w[t, : len(ids)] = (g * scale).to(w.dtype)
        return logits, w, idx

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _next_token_logits(model: nn.Module, ids: Sequence[int]) -> torch.Tensor:
    dev = next(model.parameters()).device
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=dev), use_cache=False)
    return out.logits[0].float()


@quiet_library_warnings()
def evaluate_plans(model: str | Path | nn.Module, texts: Sequence[Sequence[int]],
                   policy: str | Policy, *, params: dict[str, Any] | None = None, profile_texts: int = 0,
                   hardware: str = "rtx-4090", cache_rate: float = 0.25, seed: int = 0) -> QualityResult:
    """Run ``policy``'s plans on ``model`` over ``texts`` (token ids) and compare with the
    unmodified model (the module docstring says how). ``profile_texts`` first texts are the
    profiling split, the rest are evaluated."""
    if not 0 <= profile_texts < len(texts):
        raise MoesimError(f"quality: profile_texts={profile_texts} leaves no text to evaluate (of {len(texts)})")
    if not 0 < cache_rate <= 1:
        raise MoesimError(f"quality: cache rate must be in (0, 1], got {cache_rate}")
    net = resolve_model(model, seed=seed)
    pol = make_policy(policy, params) if isinstance(policy, str) else policy
    trace = record_texts(net, texts)
    spec = model_spec(net, trace)
    plans, sim = simulate_plans(trace, pol, spec, profile_texts=profile_texts, hardware=hardware,
                                cache_rate=cache_rate, seed=seed)
    override = PlanOverride(net, plans)
    kl_sum = agree = n_pos = 0.0
    nll_ref = nll_plan = 0.0
    n_next = 0
    try:
        for r in range(profile_texts, len(texts)):
            ids = [int(x) for x in texts[r]]
            override.text = -1
            ref = _next_token_logits(net, ids)
            override.text = r
            got = _next_token_logits(net, ids)
            lp_ref, lp_plan = F.log_softmax(ref, dim=-1), F.log_softmax(got, dim=-1)
            kl_sum += float((lp_ref.exp() * (lp_ref - lp_plan)).sum())
            agree += float((ref.argmax(-1) == got.argmax(-1)).sum())
            n_pos += len(ids)
            tgt = torch.tensor(ids[1:], device=ref.device)
            nll_ref += float(F.nll_loss(lp_ref[:-1], tgt, reduction="sum"))
            nll_plan += float(F.nll_loss(lp_plan[:-1], tgt, reduction="sum"))
            n_next += len(ids) - 1
    finally:
        override.close()
    evaluated_layers = n_pos * trace.model.num_layers
    ppl_ref, ppl_plan = float(np.exp(nll_ref / n_next)), float(np.exp(nll_plan / n_next))
    return QualityResult(policy=pol.name, texts=len(texts) - profile_texts, tokens=int(n_pos),
                         kl=kl_sum / n_pos, agreement=agree / n_pos, ppl_ref=ppl_ref, ppl_plan=ppl_plan,
                         ppl_delta=ppl_plan - ppl_ref, planned_token_layers=override.overridden / evaluated_layers,
                         sim=sim)
