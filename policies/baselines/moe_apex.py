"""``moe-apex-style``: an approximation of MoE-APEX (Tang et al., ASPLOS'26) as ActiveEvict's
evaluation describes it, "more aggressive, router-guided speculative prefetching across layers"
than Mixtral-offloading. Its adaptive-precision part is not described there and is left out.

Our reading (spec sheet ``activeevict.md`` section 5, [rec]): a per-layer LRU cache; after layer
``l`` is routed, the lookahead router's top-(k + ``extra_experts``) experts of each token for
``l + 1`` are prefetched (layer 0 of the next iteration after the last layer), and, with
``second_layer``, the previous token's routing of ``l + 2`` behind them at a lower priority.
Label it approximate in outputs: we rebuild MoE-APEX from ActiveEvict's description of it, not from its own paper.
"""

from __future__ import annotations

from moesim.policies.contract.base import Context, Outcome, View
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import LookaheadPredictor
from moesim.policies.parts.prefetchers import Prefetcher


class AggressivePrefetcher(Prefetcher):
    """Lookahead top-(k + ``extra_experts``) of the next layer, plus the previous token's routing
    of the layer after it (``second_layer``), behind every guess for the next layer."""

    def __init__(self, extra_experts: int, second_layer: bool) -> None:
        if extra_experts < 0:
            raise ValueError(f"extra_experts must be >= 0, got {extra_experts}")
        self.extra_experts = extra_experts
        self.second_layer = second_layer
        self.predictor = LookaheadPredictor()

    def required_columns(self) -> frozenset[str]:
        """Needs ``lookahead_logits``."""
        return self.predictor.required_columns()

    def setup(self, ctx: Context) -> None:
        """Width of the guess."""
        self._n = min(ctx.num_experts, ctx.top_k + self.extra_experts)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Prefetch the guesses for ``l + 1`` (or the next layer 0) and ``l + 2``."""
        L = view.num_layers
        target = layer + 1 if layer + 1 < L else 0
        guess = self.predictor.predict(view, layer, self._n)
        self.prefetch_set(view, target, [(e, 2.0 - 0.01 * r) for r, (e, _) in enumerate(guess)])
        if self.second_layer and layer + 2 < L:
            prev = view.previous_routing(layer + 2)
            if prev is not None:
                # the distinct experts in first-seen order, then without the dropped (negative)
                # ones: the same list as dropping them first, without a generator
                order = list(dict.fromkeys(prev.reshape(-1).tolist()))
                if order and min(order) < 0:
                    order = [e for e in order if e >= 0]
                self.prefetch_set(view, layer + 2, [(e, 1.0 - 0.01 * r) for r, e in enumerate(order)])


@register
class MoEApexStyle(Composed):
    """LRU plus aggressive lookahead prefetch (see the module docstring); approximate."""

    name = "moe-apex-style"
    summary = "approximate MoE-APEX: LRU + lookahead top-(k+1) prefetch of l+1 and previous-token l+2"
    paper = "Tang et al., MoE-APEX (ASPLOS'26), as ActiveEvict's evaluation describes it (approximate)"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}),
                             source="ActiveEvict's evaluation: router-guided prefetch across layers")

    def __init__(self, *, extra_experts: int = 1, second_layer: bool = True) -> None:
        self.extra_experts = extra_experts
        self.second_layer = second_layer
        self.assemble(cache=LRUCache(), prefetcher=AggressivePrefetcher(extra_experts, second_layer))
