"""``random-substitute``: the substitution papers' random baseline, on an LRU cache."""

from __future__ import annotations

from moesim.policies.compose import Composed
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.planners import RandomSubstitutePlanner
from moesim.policies.registry import register


@register
class RandomSubstitute(Composed):
    """LRU cache; a routed expert that is absent is swapped for a random resident expert of the
    same layer that the token does not already use (at most ``max_per_token`` per token), so it
    is never loaded; without a resident candidate it loads on demand. Lossy: the baseline that
    BuddyMoE's buddy lists improve on."""

    name = "random-substitute"
    lossy = True
    summary = "lossy: swap each absent expert for a random resident one of its layer"
    paper = "baseline of BuddyMoE (Wang et al., PPoPP 2026)"

    def __init__(self, *, max_per_token: int | None = None) -> None:
        self.max_per_token = max_per_token
        self.assemble(cache=LRUCache(), planner=RandomSubstitutePlanner(max_per_token))
