"""MoEpic's two degenerate cases (section 2.3 of the paper), registered as policies of their
own: ``moepic-cache-only`` (``theta`` 1: whole experts under LCP, no prefetch) and
``moepic-prefetch-only`` (``theta`` 0: nothing cached, whole experts prefetched speculatively
into the transfer buffer). Both are :class:`~moesim.policies.moepic.policy.MoEpic` with other
defaults.
"""

from __future__ import annotations

from moesim.policies.contract.needs import TOP_K, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.moepic.policy import MoEpic


@register
class MoEpicCacheOnly(MoEpic):
    """MoEpic's "Cache Only" degenerate case (section 2.3): whole experts (``theta`` 1) under
    LCP with uniform budgets, no prefetch."""

    name = "moepic-cache-only"
    setup_needs = SetupNeeds(source="MoEpic section 2.3: theta 1, no prefetch")
    summary = "MoEpic degenerate case: theta 1, LCP whole-expert cache, no prefetch"

    def __init__(self, *, theta: float = 1.0, rho: float = 0.25, omega: float = 128.0,
                 tau: int = 5000, zeta: float = 0.01, speculative: bool = True,
                 prefetch: bool = False, cache_policy: str = "lcp",
                 configurator: bool = False) -> None:
        super().__init__(theta=theta, rho=rho, omega=omega, tau=tau, zeta=zeta,
                         speculative=speculative, prefetch=prefetch, cache_policy=cache_policy,
                         configurator=configurator)


@register
class MoEpicPrefetchOnly(MoEpic):
    """MoEpic's "Prefetch Only" degenerate case (section 2.3): ``theta`` 0, nothing cached,
    whole experts prefetched speculatively into the transfer buffer."""

    name = "moepic-prefetch-only"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}), buffer_experts=TOP_K,
                             source="MoEpic section 2.3: theta 0, speculative prefetch into a buffer of K experts")
    summary = "MoEpic degenerate case: theta 0, no cache, speculative whole-expert prefetch"

    def __init__(self, *, theta: float = 0.0, rho: float = 0.25, omega: float = 128.0,
                 tau: int = 5000, zeta: float = 0.01, speculative: bool = True,
                 prefetch: bool = True, cache_policy: str = "lcp",
                 configurator: bool = False) -> None:
        super().__init__(theta=theta, rho=rho, omega=omega, tau=tau, zeta=zeta,
                         speculative=speculative, prefetch=prefetch, cache_policy=cache_policy,
                         configurator=configurator)
