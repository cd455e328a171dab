"""The recorder of the tracer: hooks on a model's routers that record routing per token.

:class:`HookRegistry` owns every hook put on a model (it finds the MoE layers with
:func:`traces.arch.find_moe_layers`). :class:`RoutingRecorder` hangs a forward hook on every
router and one on the input embedding; per request it returns a :class:`RequestRecord`.
What the columns hold is described in :mod:`traces.tracer`.

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

Imports torch at import time: import it lazily (as :mod:`traces.tracer` is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import (
    DECODE,
    OPTIONAL_COLUMNS,
    PREFILL,
)
from moesim.traces.tracer.arch import ArchSpec, find_moe_layers, model_config

ALL_OPTIONAL = frozenset(OPTIONAL_COLUMNS)
"""Every optional column name: the default set a recorder records."""


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
        cfg = model_config(registry.model)
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
