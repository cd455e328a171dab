"""Pre-gated MoE as MoEpic's evaluation uses it (Hwang et al., ISCA 2024; MoEpic section 4.1):
the pre-gate of layer ``l`` selects the experts of layer ``l + 1`` while layer ``l`` runs, and
they are prefetched in parallel with its computation. Nothing is cached: an expert leaves VRAM
once its layer has run, so the VRAM budget does not change its speed (MoEpic section 4.2).

The pre-gate is the trace's lookahead router (``lookahead_logits``), the best a pre-gate can do
without fine-tuning; the recorded routing still decides which experts run, and a mispredicted
one loads on demand (lossless). Layer 0 has no pre-gate (its experts load on demand) unless
``cross_token`` predicts it from the previous token's last layer. Without lookahead logits the
previous token's routing of layer ``l + 1`` stands in (the run warns).
"""

from __future__ import annotations

from moesim.policies.contract.base import Context, Plan, ReadView, Routing, UnitKey, View
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import DropAfterUseCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import AutoPredictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher


class PreGatePrefetcher(NextLayerPrefetcher):
    """Next-layer prefetch that drops a guess landing after its layer was routed."""

    def __init__(self, experts: int | None, cross_token: bool) -> None:
        super().__init__(AutoPredictor(), experts=experts, cross_token=cross_token)
        self._spec: dict[UnitKey, int] = {}
        self.routed = (-1, -1)

    def prefetch_set(self, view: View, layer: int, experts: list[tuple[int, float]]) -> int:
        """Issue each guess; remember which iteration it is for."""
        it = view.iteration_index
        t_it = it if layer > view.layer else it + 1
        prefetch, spec = view.prefetch, self._spec
        n = 0
        for e, score in experts:
            if prefetch(layer, e, 0, score):
                spec[(layer, e, 0)] = t_it
                n += 1
        return n

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        """A guess that landed after its layer had run leaves at once."""
        t_it = self._spec.pop(unit, None)
        if demand or t_it is None:
            return
        it = view.iteration_index
        r_it, r_layer = self.routed
        if (t_it < it or (t_it == it and r_it == it and unit[0] <= r_layer)) and not view.pinned(unit[0], unit[1]):
            view.evict(*unit)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """Forget the guess."""
        self._spec.pop(unit, None)


@register
class PreGated(Composed):
    """Prefetch the next layer's pre-gated ``prefetch_experts`` (default ``top_k``) experts per
    token; keep nothing after use."""

    name = "pregated"
    summary = "Pre-gated MoE: prefetch the next layer's pre-gated experts, cache nothing"
    paper = "Hwang et al., Pre-gated MoE (ISCA 2024), as MoEpic's evaluation runs it"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}),
                             source="Pre-gated MoE: the pre-gate of layer l selects layer l+1's experts")

    def __init__(self, *, prefetch_experts: int | None = None, cross_token: bool = False) -> None:
        self.prefetch_experts = prefetch_experts
        self.cross_token = cross_token
        self._pre = PreGatePrefetcher(prefetch_experts, cross_token)
        self.assemble(cache=DropAfterUseCache(), prefetcher=self._pre)

    def setup(self, ctx: Context) -> None:
        """Set up the parts and forget the last run's guesses."""
        super().setup(ctx)
        self._pre._spec = {}
        self._pre.routed = (-1, -1)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """Remember where routing stands (a later landing of a guess for it is useless)."""
        self._pre.routed = (view.iteration_index, layer)
        return None
