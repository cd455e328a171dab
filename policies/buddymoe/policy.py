"""BuddyMoE: replace a prefetch miss by a resident co-activated "buddy" instead of loading it
(Wang et al., "BuddyMoE: Exploiting Expert Redundancy to Accelerate Memory-Constrained MoE
Inference", PPoPP 2026). Lossy.

BuddyMoE complements an existing cache and next-layer prefetcher (section 3.4): ``base`` names
the registered lossless policy it sits on (default ``mixtral-offloading``: per-layer LRU pools
and lookahead prefetch of layer ``l + 1``, the "Original" of the paper's tables), with
``base_params``. On top, :class:`~moesim.policies.buddymoe.planner.BuddySubstitutePlanner`
runs Algorithm 1 with the TAE gate (``tau``, ``tau_percentile``, ``temperature``, ``gamma``), the
batch gate (``beta``) and the replacement budget (``rho``), from buddy lists built in ``setup``
out of the scenario's ``profile:`` split (Eqs. 4-6: ``alpha``, ``k_max``, ``epsilon``,
``coactivation``).

The paper's tables label the CFT (``alpha``) as "tau" and give ``|B|`` (``k_max``); a table row
(tau, |B|, rho) = (0.95, 16, 3) is ``alpha=0.95, k_max=16, rho=3`` with the TAE gate off
(``tau=0``), the spec sheet's recommended reading (A1). Readings taken where the paper is silent
(spec sheet section 7): ``rho`` counts swaps per token and layer (A2); only ``ABSENT`` experts
are replaced, in-flight prefetches are awaited (A3, ``substitute_late``); a miss is a host-to-
device load (A4; ``fallback="cpu"`` takes the other reading, llama.cpp's: the misses left run on the
host CPU); decode only (A12, ``apply_to_prefill``). The planner's counters (swaps, misses without
a buddy, token-layers kept by the TAE gate, layers bypassed by beta, misses past rho) are
``policy.planner.counts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moesim.policies.buddymoe.planner import BuddySubstitutePlanner
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.lossless_base import base_needs, base_parts


@register
class BuddyMoE(Composed):
    """A lossless base cache + prefetcher, plus buddy substitution of its demand misses."""

    name = "buddymoe"
    summary = "BuddyMoE: swap a missing expert for a resident co-activated buddy (lossy, on a base cache)"
    paper = ("Wang et al., BuddyMoE: Exploiting Expert Redundancy to Accelerate Memory-Constrained "
             "Mixture-of-Experts Inference (PPoPP 2026)")
    lossy = True
    setup_needs = SetupNeeds(profile_share=DEFAULT_PROFILE_SHARE,
                             source="BuddyMoE section 3.3: buddy lists from an offline co-activation profile "
                                    "(the profiling set is not named)")

    def __init__(self, *, base: str = "mixtral-offloading", base_params: dict[str, Any] | None = None,
                 alpha: float | Sequence[float] = 0.95, k_max: int = 16, search_depth: int | None = None,
                 rho: int | None = None, tau: float | Sequence[float] = 0.0,
                 tau_percentile: float | None = None, temperature: float = 1.0,
                 gamma: float | None = None, beta: float | None = None, eta: float = 0.0,
                 coactivation: str = "binary", epsilon: float = 0.0, substitute_late: bool = False,
                 fallback: str = "load", apply_to_prefill: bool = False) -> None:
        if base == "buddymoe":
            raise ValueError("base cannot be buddymoe itself")
        self.base = base
        self.base_params = base_params
        self.alpha = alpha
        self.k_max = k_max
        self.search_depth = search_depth
        self.rho = rho
        self.tau = tau
        self.tau_percentile = tau_percentile
        self.temperature = temperature
        self.gamma = gamma
        self.beta = beta
        self.eta = eta
        self.coactivation = coactivation
        self.epsilon = epsilon
        self.substitute_late = substitute_late
        self.fallback = fallback
        self.apply_to_prefill = apply_to_prefill
        cache, prefetcher = base_parts(base, base_params)
        self.assemble(cache=cache, prefetcher=prefetcher, planner=BuddySubstitutePlanner(
            alpha=alpha, k_max=k_max, search_depth=search_depth, rho=rho, tau=tau,
            tau_percentile=tau_percentile, temperature=temperature, gamma=gamma, beta=beta, eta=eta,
            coactivation=coactivation, epsilon=epsilon, substitute_late=substitute_late,
            fallback=fallback, apply_to_prefill=apply_to_prefill))

    def needs(self) -> SetupNeeds:
        """Its offline profile and its base policy's needs."""
        return super().needs().merged(base_needs(self.base, self.base_params))
