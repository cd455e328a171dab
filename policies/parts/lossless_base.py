"""The base under a lossy planner: a registered lossless composition taken apart into its cache
rule and prefetcher, so that a planner (BuddyMoE's buddies, the random baseline) sits on the
very cache and prefetcher that policy runs alone, with the same parameters."""

from __future__ import annotations

from typing import Any

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import make_policy
from moesim.policies.parts.caches import CacheRule
from moesim.policies.parts.compose import _DISPATCHED, Composed
from moesim.policies.parts.prefetchers import Prefetcher

_OWN_HOOKS = (*_DISPATCHED, "setup", "warm", "on_routed", "choose_victim", "admit", "part_fractions")


def base_parts(name: str, params: dict[str, Any] | None = None) -> tuple[CacheRule, Prefetcher | None]:
    """The cache rule and prefetcher of the registered policy ``name`` built with ``params``.
    It must be a per-layer, lossless, non-oracle :class:`Composed` without a planner whose class
    adds no hook of its own (else its behaviour would not survive being taken apart): a
    ``ValueError`` names what does not fit."""
    pol = make_policy(name, params)
    if not isinstance(pol, Composed):
        raise ValueError(f"base {name!r} is not a composition of parts")
    if pol.lossy or pol.planner is not None:
        raise ValueError(f"base {name!r} already plans what runs (lossy); a base must be lossless")
    if pol.oracle:
        raise ValueError(f"base {name!r} is an oracle; a base must be causal")
    if pol.scope != "layer":
        raise ValueError(f"base {name!r} has one global pool; a base must keep per-layer pools")
    own = [h for h in _OWN_HOOKS if getattr(type(pol), h) is not getattr(Composed, h)]
    if own:
        raise ValueError(f"base {name!r} adds hooks of its own ({', '.join(own)}) beyond its parts")
    return pol.cache, pol.prefetcher


def base_needs(name: str, params: dict[str, Any] | None = None) -> SetupNeeds:
    """The setup needs of the registered policy ``name`` built with ``params``: a policy that
    sits on that base needs what the base needs besides its own."""
    return make_policy(name, params).needs()
