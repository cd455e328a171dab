"""Pre-gated MoE as MoEpic's evaluation uses it (Hwang et al., ISCA 2024; MoEpic section 4.1):
the pre-gate of layer ``l`` selects the experts of layer ``l + 1`` while layer ``l`` runs, and
they are prefetched in parallel with its computation. Nothing is cached: an expert leaves VRAM
once its layer has run, so the VRAM budget does not change its speed (MoEpic section 4.2).

The pre-gate is the trace's lookahead router (``lookahead_logits``: router ``l + 1`` applied to
layer ``l``'s hidden state), the best a pre-gate can do without fine-tuning; the recorded
routing still decides which experts run, and a mispredicted one loads on demand (lossless).
Layer 0 has no pre-gate (its experts load on demand) unless ``cross_token`` predicts it from
the previous token's last layer. Without lookahead logits in the trace, the previous token's
routing of layer ``l + 1`` stands in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.base import Outcome, Policy, Routing, UnitKey
from moesim.policies.registry import register
from moesim.policies.speculative import top_experts

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine import EngineView, SimContext


@register
class PreGated(Policy):
    """Prefetch the next layer's pre-gated ``prefetch_experts`` (default ``top_k``) experts per
    token; keep nothing after use."""

    name = "pregated"
    summary = "Pre-gated MoE: prefetch the next layer's pre-gated experts, cache nothing"

    def __init__(self, *, prefetch_experts: int | None = None, cross_token: bool = False) -> None:
        if prefetch_experts is not None and prefetch_experts < 0:
            raise ValueError("prefetch_experts must be >= 0")
        self.prefetch_experts = prefetch_experts
        self.cross_token = cross_token
        self._k = 0
        self._E = 0
        self._lookahead = True
        self._spec: dict[UnitKey, int] = {}
        self._routed = (-1, -1)

    def setup(self, ctx: SimContext) -> None:
        self._k = ctx.top_k if self.prefetch_experts is None else self.prefetch_experts
        self._E = ctx.num_experts
        self._lookahead = ctx.has_lookahead
        self._spec = {}
        self._routed = (-1, -1)

    def _clear(self, view: EngineView, layer: int) -> None:
        for key in view.units_of_layer(layer):
            view.evict(*key)   # only resident, unpinned units go; transfers in flight stay

    def warm(self, view: EngineView, units: list[UnitKey]) -> None:
        for key in units:
            view.evict(*key)

    def before_layer(self, view: EngineView, layer: int) -> None:
        if layer > 0:
            self._clear(view, layer - 1)

    def plan(self, view: EngineView, layer: int, routing: Routing) -> np.ndarray | None:
        self._routed = (view.iteration_index, layer)
        return None

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        if self._k == 0:
            return
        L = view.num_layers
        it = view.iteration_index
        if layer + 1 < L:
            target, t_it = layer + 1, it
        elif self.cross_token:
            target, t_it = 0, it + 1
        else:
            return
        if self._lookahead:
            logits = view.lookahead_logits(layer)
            assert logits is not None
            guesses = top_experts(logits, self._k)
        else:
            prev = view.previous_routing(target) if target > 0 else view.routing(0).experts
            if prev is None:
                return
            scores = np.zeros((prev.shape[0], self._E), dtype=np.float32)
            for t in range(prev.shape[0]):
                scores[t, prev[t]] = np.arange(prev.shape[1], 0, -1)
            guesses = top_experts(scores, self._k)
        for e, score in guesses:
            if view.prefetch(target, e, priority=score):
                self._spec[(target, e, 0)] = t_it

    def on_loaded(self, view: EngineView, unit: UnitKey, demand: bool) -> None:
        t_it = self._spec.pop(unit, None)
        if demand or t_it is None:
            return
        it = view.iteration_index
        r_it, r_layer = self._routed
        if (t_it < it or (t_it == it and r_it == it and unit[0] <= r_layer)) and not view.pinned(unit[0], unit[1]):
            view.evict(*unit)   # landed after its layer had run

    def on_evict(self, view: EngineView, unit: UnitKey) -> None:
        self._spec.pop(unit, None)

    def on_iteration_end(self, view: EngineView) -> None:
        self._clear(view, view.num_layers - 1)

    def admit(self, view: EngineView, unit: UnitKey) -> bool:
        return False
