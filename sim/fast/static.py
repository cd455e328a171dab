"""When ``static`` may take the fast path: the policy pins its static set with one round of
prefetches at the first iteration (behind the demand loads, on the same lanes), so it is not
demand-only in general. When the run starts warm with that set already resident
(``cache.initial: popular`` places the most popular experts, a superset of the static set, and
the rule's ``warm`` drops the rest), those prefetches find every unit present and do nothing;
the rule then only evicts the oldest resident outside the static set, as FIFO over the
staging room does, and the run is a demand-only one whenever each layer's staging room holds
what one step can miss (a full static set otherwise refuses the victims a demand load needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moesim.policies.contract.base import RESIDENT
from moesim.policies.parts.caches import StaticCache
from moesim.sim.fast.capability import sole_rule

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def static_sets(state: RunState[Transfers]) -> list[set[int]] | None:
    """Each layer's static experts when ``state``'s policy is one cache rule that declares the
    ``static`` kernel (the shipped ``static``: the rule alone, no hook overridden), else None."""
    rule = sole_rule(state.policy)
    if rule is None or rule.kernel != "static" or not isinstance(rule, StaticCache):
        return None
    return rule.static_experts(state.L)


def static_refusal(state: RunState[Transfers], sets: list[set[int]]) -> str | None:
    """Why a ``static`` run cannot take the fast path (see the module docstring), or None."""
    units = state.vram.units
    for layer, static in enumerate(sets):
        for e in static:
            u = units.get((layer, e, 0))
            if u is None or u.state != RESIDENT:
                return ("policy 'static' loads its static set at the first iteration (start warm "
                        "with cache.initial: popular for the fast path)")
    if state.global_pool:
        return "the policy uses one global pool"
    widest = max((it.n_tokens for it in state.workload.iterations), default=0)
    for layer, static in enumerate(sets):
        room = state.vram.capacity[layer] // state.expert_bytes - len(static)
        need = min(widest * state.K, state.E - len(static))
        if need > room:
            return (f"policy 'static' stages up to {need} experts of layer {layer} in {room} slots "
                    "(demand loads could wait for room)")
    return None
