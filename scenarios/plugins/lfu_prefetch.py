"""A policy of your own in one file: an LFU cache with next-layer lookahead prefetch.

A scenario lists this file under ``plugins:`` and names the policy; nothing in moesim changes.
"""

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LFUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import make_predictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher


@register
class LfuPrefetch(Composed):
    """LFU cache + speculative prefetch of the next layer's ``prefetch_experts`` experts."""

    name = "lfu-prefetch"
    summary = "LFU + next-layer prefetch (plugin example)"
    # what it needs to run as meant: studies mark it n/a on a trace without the lookahead
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}),
                             source="the next layer's router on the current hidden state")

    def __init__(self, *, prefetch_experts: int = 2, predictor: str = "auto") -> None:
        self.prefetch_experts = prefetch_experts
        self.predictor = predictor
        self.assemble(cache=LFUCache(),
                      prefetcher=NextLayerPrefetcher(make_predictor(predictor), experts=prefetch_experts))

    def needs(self) -> SetupNeeds:
        """``predictor: previous-token`` reads no lookahead."""
        needs = super().needs()
        return needs.without(columns={"lookahead_logits"}) if self.predictor == "previous-token" else needs
