"""``random-substitute``: the substitution papers' random baseline, on a lossless base cache."""

from __future__ import annotations

from typing import Any

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.lossless_base import base_needs, base_parts
from moesim.policies.parts.planners import RandomSubstitutePlanner


@register
class RandomSubstitute(Composed):
    """A routed expert that is absent is swapped for a random resident expert of the same layer
    that the token does not already use (at most ``max_per_token`` per token), so it is never
    loaded; without a resident candidate it loads on demand. The cache (and prefetcher) is the
    registered lossless policy ``base`` with ``base_params`` (default ``lru``; BuddyMoE's tables
    compare on ``mixtral-offloading``). Lossy: the baseline that BuddyMoE's buddy lists improve on."""

    name = "random-substitute"
    lossy = True
    summary = "lossy: swap each absent expert for a random resident one of its layer"
    paper = "baseline of BuddyMoE (Wang et al., PPoPP 2026)"
    setup_needs = SetupNeeds()

    def __init__(self, *, max_per_token: int | None = None, base: str = "lru",
                 base_params: dict[str, Any] | None = None) -> None:
        self.max_per_token = max_per_token
        self.base = base
        self.base_params = base_params
        cache, prefetcher = base_parts(base, base_params)
        self.assemble(cache=cache, prefetcher=prefetcher, planner=RandomSubstitutePlanner(max_per_token))

    def needs(self) -> SetupNeeds:
        """Its own (none) and its base policy's."""
        return super().needs().merged(base_needs(self.base, self.base_params))
