"""``belady``: the optimal demand cache (an oracle bound, not a real policy)."""

from __future__ import annotations

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import BeladyCache
from moesim.policies.parts.compose import Composed


@register
class Belady(Composed):
    """Evict the unit whose next use lies farthest in the future (Belady's MIN). Reads the
    recorded routing of later iterations through ``ctx.future``: a bound for demand caching."""

    name = "belady"
    oracle = True
    setup_needs = SetupNeeds()
    summary = "oracle: evict the expert used farthest in the future (bound)"

    def __init__(self) -> None:
        self.assemble(cache=BeladyCache())
