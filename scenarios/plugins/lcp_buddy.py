"""A composition of one's own: MoEpic's LCP cache (policies/parts/caches.py, ``LCPCache``) with
BuddyMoE's substitution planner (policies/buddymoe/planner.py), in one file and no new
mechanism. A scenario lists this file under ``plugins:`` and names ``lcp-buddy``."""

from moesim.policies.buddymoe.planner import BuddySubstitutePlanner
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LCPCache
from moesim.policies.parts.compose import Composed


@register
class LcpBuddy(Composed):
    """LCP eviction (MoEpic Eq. 4: ``rho``, ``omega``) + buddy substitution of the misses
    (BuddyMoE: CFT ``alpha``, list cap ``k_max``, swaps per token ``swaps_per_token``)."""

    name = "lcp-buddy"
    summary = "MoEpic's LCP cache + BuddyMoE's buddy substitution (plugin example, lossy)"
    lossy = True
    setup_needs = SetupNeeds(profile_share=DEFAULT_PROFILE_SHARE,
                             source="BuddyMoE section 3.3: buddy lists from an offline co-activation profile")

    def __init__(self, *, rho: float = 0.25, omega: float = 128.0, alpha: float = 0.95, k_max: int = 16,
                 swaps_per_token: int | None = 3) -> None:
        self.rho = rho
        self.omega = omega
        self.alpha = alpha
        self.k_max = k_max
        self.swaps_per_token = swaps_per_token
        self.assemble(cache=LCPCache(rho=rho, omega=omega),
                      planner=BuddySubstitutePlanner(alpha=alpha, k_max=k_max, rho=swaps_per_token))
