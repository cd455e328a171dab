"""``lcp``: MoEpic's Least Cache Priority as a demand cache, comparable with ``lru``, ``lfu`` and
``random`` (the bookkeeping is :mod:`moesim.policies.parts.lcp_priority`)."""

from __future__ import annotations

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LCPCache
from moesim.policies.parts.compose import Composed


@register
class LCP(Composed):
    """Demand cache that evicts the expert of least cache priority ``mu * rho^(nu/omega)``
    (MoEpic, Eq. 4), with ``rho`` 0.25 and ``omega`` 128 tokens as in the paper. Whole experts;
    nothing is prefetched. Priorities count every token, resident or not."""

    name = "lcp"
    setup_needs = SetupNeeds()
    summary = "evict the expert of least cache priority mu*rho^(nu/omega) (MoEpic's LCP)"
    paper = "MoEpic (Yan et al.), section 3.3, Eq. 4"

    def __init__(self, *, rho: float = 0.25, omega: float = 128.0) -> None:
        self.rho = rho
        self.omega = omega
        self.assemble(cache=LCPCache(rho=rho, omega=omega))
