"""Which kernel of the fast path replays a run (:func:`kernel_of`; None: the driver), and why a
kernel refuses one. Kernels are chosen by the names a policy's parts declare
(:mod:`moesim.policies.parts.kernel`), never by a part's class, and read the parts' state through
their public accessors. Every kernel starts from rest (no copy under way) and needs what
:func:`~moesim.sim.fast.refusal.kernel_refusal` asks.

* The cache kernel (:mod:`moesim.sim.fast.order`) stands in for a policy that is one cache rule
  declaring a decider (:mod:`moesim.policies.parts.deciders`): the rule itself, or a composition
  of that rule alone that overrides no hook of its own
  (:meth:`~moesim.policies.parts.compose.Composed.parts_only`); it needs every layer's demand
  loads to find room at once: each pool holds as many experts as one layer of an iteration runs.
  ``static`` pins its static set with one round of prefetches at the first iteration (behind
  the demand loads, on the same lanes), so it is not demand-only in general; started warm with
  that set resident (``cache.initial: popular`` places the most popular experts, a superset of
  it, and the rule's ``warm`` drops the rest), those prefetches find every unit present and do
  nothing; the rule then only evicts the oldest resident outside the static set, as FIFO over
  the staging room does, and the run is a demand-only one whenever each layer's staging room
  holds what one step can miss (a full static set otherwise refuses the victims a demand load needs).
* The next-layer prefetch kernel (:mod:`moesim.sim.fast.prefetch`) stands in for a composition
  of nothing but an ``lru`` rule and a ``next-layer`` prefetcher, likewise adding no hook (the
  shipped ``mixtral-offloading`` and ``oracle-prefetch``), with a lookahead, previous-token or
  oracle predictor, on one copy lane (priority or fifo order); the run starts with every present
  unit resident and used. None of these parts ever aborts a copy in flight
  (``view.abort_prefetch``), which the kernel does not model; a policy that may (MoEpic, or a
  composition with a hook of its own) takes the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.contract.base import Policy
from moesim.policies.parts.caches import CacheRule, RecencyCache, StaticCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import AutoPredictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher
from moesim.sim.fast.refusal import kernel_refusal

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

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


def ordered_kind(state: RunState[Transfers]) -> str | None:
    """The name of the decider that replays ``state``'s policy when it is one cache rule that
    declares one (see the module docstring), else None (call on runs the fast path accepted;
    None too with a ``runtime.demand_load_us``, which the driver charges, and for what
    :func:`~moesim.sim.fast.refusal.kernel_refusal` refuses)."""
    if state.cost.demand_load_s() or kernel_refusal(state) is not None:
        return None
    rule = sole_rule(state.policy)
    return None if rule is None or rule.decider is None else rule.decider.name


def prefetch_refusal(state: RunState[Transfers]) -> str | None:
    """Why the next-layer prefetch kernel cannot replay ``state``'s run exactly, or None (call
    after the policy's ``setup`` and the initial fill, on a run the fast path accepted whose
    policy :func:`next_layer_parts` takes)."""
    parts = next_layer_parts(state.policy)
    assert parts is not None, "not a policy of the prefetch kernel"
    source = predictor_source(parts[1])
    if source is None:
        return f"the kernel does not reproduce predictor {parts[1].predictor.__class__.__name__}"
    if source == "lookahead":
        la = state.trace.lookahead_logits
        if la is None:
            return "the trace has no lookahead_logits"
        if la.dtype.kind != "f" or bool(np.isnan(la).any()):
            return "the lookahead logits are not plain floats (or hold NaN)"
    if source == "oracle" and bool((state.trace.experts < 0).any()):
        return "the trace has dropped routing slots (the oracle would prefetch expert -1)"
    why = kernel_refusal(state)
    if why is not None:
        return why
    if state.cost.prefetch_issue_s():
        return "runtime.prefetch_issue_us is set (the kernel does not charge it)"
    if int(state.cost.hardware.copy_engines) != 1:
        return "the kernel models one copy engine"
    if not all(u.used for u in state.vram.units.values()):
        return "the run starts with units never used since they came"
    return None


def _stages_in_room(state: RunState[Transfers], rule: StaticCache, widest: int) -> bool:
    """A ``static`` run is demand-only (see the module docstring): its static set resident and
    each layer's staging room holding what one step of at most ``widest`` tokens can miss."""
    sets = rule.static_experts(state.L)
    units = state.vram.units
    if any(units.get((layer, e, 0)) is None for layer, static in enumerate(sets) for e in static):
        return False   # it loads its static set at the first iteration (cache.initial: popular starts warm)
    return all(min(widest * state.K, state.E - len(static)) <= state.vram.capacity[layer] // state.expert_bytes
               - len(static) for layer, static in enumerate(sets))


def kernel_of(state: RunState[Transfers]) -> str | None:
    """The kernel that replays ``state``'s run (accepted by the fast path): its name (a cache
    rule's decider's, e.g. ``lru`` or ``static``; ``next-layer``), or None for the driver."""
    policy = state.policy
    if next_layer_parts(policy) is not None:
        return "next-layer" if prefetch_refusal(state) is None else None
    if policy.uses_hook("on_loaded"):
        return None
    kind = ordered_kind(state)
    rule = sole_rule(policy)
    if kind is None or rule is None:
        return None
    widest = max((it.n_tokens for it in state.workload.iterations), default=0)
    if rule.kernel == "static" and isinstance(rule, StaticCache):
        if not _stages_in_room(state, rule, widest):
            return None
    elif not policy.demand_only():
        return None
    per_pool = min(state.vram.capacity) // state.expert_bytes
    return kind if min(widest * state.K, state.E) <= per_pool else None
