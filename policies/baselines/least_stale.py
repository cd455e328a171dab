"""``least-stale``: SpecMD's Least-Stale eviction (arXiv 2602.03921) **as assumed here**
(:mod:`moesim.policies.parts.least_stale` states the assumption): one expert cache shared by
all layers, evicting the expert whose layer runs again last; no prefetch."""

from __future__ import annotations

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.least_stale import LeastStaleCache


@register
class LeastStale(Composed):
    """One global pool; the victim is the resident expert farthest from its layer's next turn
    in the layer-sequential schedule, ties least recently used. Causal (not an oracle). The
    paper's exact rule could not be read: this is an assumption (see the part's docstring)."""

    name = "least-stale"
    scope = "global"
    summary = "global cache: evict the expert whose layer runs again last (SpecMD, rule assumed)"
    paper = ("Hoang, Jaiswal, Samragh, Cho: SpecMD (arXiv 2602.03921), Least-Stale eviction; the rule is "
             "an assumption (the paper's precise statement was not available)")
    setup_needs = SetupNeeds()

    def __init__(self) -> None:
        self.assemble(cache=LeastStaleCache())
