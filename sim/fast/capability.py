"""Which kernel a run's policy declares (:mod:`moesim.policies.parts.kernel`): the kernels are
chosen by the names the parts declare, never by a part's class, and read the parts' state
through their public accessors.

* The cache kernel (:mod:`moesim.sim.fast.order`, :mod:`moesim.sim.fast.static`) stands in for
  a policy that is one cache rule declaring a decider (:mod:`moesim.policies.parts.deciders`):
  the rule itself, or a composition of that rule alone that overrides no hook of its own
  (:meth:`~moesim.policies.parts.compose.Composed.parts_only`).
* The next-layer prefetch kernel (:mod:`moesim.sim.fast.prefetch`) stands in for a composition
  of nothing but an ``lru`` rule and a ``next-layer`` prefetcher, likewise adding no hook.
"""

from __future__ import annotations

from moesim.policies.contract.base import Policy
from moesim.policies.parts.caches import CacheRule, RecencyCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import AutoPredictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher

SOURCES = ("lookahead", "previous-token", "oracle")
"""The predictors' sources that the next-layer prefetch kernel replays."""


def sole_rule(policy: Policy) -> CacheRule | None:
    """The cache rule that is all of ``policy`` (itself, or the only part of a composition that
    adds no hook), else None."""
    if isinstance(policy, CacheRule):
        return policy
    if (isinstance(policy, Composed) and policy.prefetcher is None and policy.planner is None
            and policy.parts_only()):
        return policy.cache
    return None


def next_layer_parts(policy: Policy) -> tuple[RecencyCache, NextLayerPrefetcher] | None:
    """The LRU rule and the next-layer prefetcher that are all of ``policy``, when the
    prefetch kernel stands in for them (whatever their predictor: see :func:`predictor_source`),
    else None."""
    if not (isinstance(policy, Composed) and policy.planner is None and policy.parts_only()):
        return None
    cache, pf = policy.cache, policy.prefetcher
    # the names decide; the classes give the kernel the accessors it reads
    if (cache.kernel == "lru" and isinstance(cache, RecencyCache) and pf is not None
            and pf.kernel == "next-layer" and isinstance(pf, NextLayerPrefetcher)):
        return cache, pf
    return None


def predictor_source(pf: NextLayerPrefetcher) -> str | None:
    """What ``pf``'s predictor guesses from, as the kernel names it: ``lookahead``,
    ``previous-token`` or ``oracle`` (an ``auto`` predictor: the source it chose at set-up), or
    None (a predictor the kernel does not reproduce)."""
    pred = pf.predictor
    if pred.kernel == "auto" and isinstance(pred, AutoPredictor):
        pred = pred.inner
    return pred.kernel if pred.kernel in SOURCES else None
