"""Composition: a policy assembled from a cache rule, an optional prefetcher and an optional
planner, none of which knows the others (libCacheSim attaches prefetchers to any cache;
scikit-learn's Pipeline joins estimators the same way).

A registered policy subclasses :class:`Composed`, takes its parameters as keywords (stored as
attributes, so ``get_params`` reads them back) and calls :meth:`Composed.assemble`::

    @register
    class LfuPrefetch(Composed):
        name = "lfu-prefetch"
        def __init__(self, *, prefetch_experts: int = 2) -> None:
            self.prefetch_experts = prefetch_experts
            self.assemble(cache=LFUCache(),
                          prefetcher=NextLayerPrefetcher(LookaheadPredictor(), experts=prefetch_experts))

Hooks reach the parts in the order cache, prefetcher, planner; ``on_routed`` is the planner's,
``choose_victim``, ``admit`` and ``part_fractions`` are the cache's. The prefetcher is handed the
cache, so that what it issues counts as used and a prefetched set is never its own victim.
"""

from __future__ import annotations

from typing import Any

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    Plan,
    Policy,
    ReadView,
    Routing,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.parts.caches import CacheRule
from moesim.policies.parts.planners import Planner
from moesim.policies.parts.prefetchers import Prefetcher

_DISPATCHED = ("on_iteration_start", "before_layer", "on_access", "after_layer", "on_layer_end",
               "on_iteration_end", "on_loaded", "on_evict", "on_cancel")
_OWN = (*_DISPATCHED, "on_routed", "choose_victim", "admit", "setup", "part_fractions", "preload")


class Composed(Policy):
    """A policy made of a cache rule, an optional prefetcher and an optional planner."""

    cache: CacheRule
    prefetcher: Prefetcher | None
    planner: Planner | None

    def assemble(self, *, cache: CacheRule, prefetcher: Prefetcher | None = None,
                 planner: Planner | None = None) -> None:
        """Join the parts (call from ``__init__``)."""
        self.cache = cache
        self.prefetcher = prefetcher
        self.planner = planner
        if prefetcher is not None:
            prefetcher.cache = cache
        self._parts: list[Policy] = [p for p in (cache, prefetcher, planner) if p is not None]
        self._by_hook = {hook: [getattr(p, hook) for p in self._parts if p.uses_hook(hook)] for hook in _DISPATCHED}
        self._bind_direct()

    def _bind_direct(self) -> None:
        """Where a hook this class does not override reaches one part only, make the part's
        bound method the instance's hook: the engine then calls it without the dispatch frame
        (these hooks run for every layer, transfer and eviction). Same calls, same order."""
        own = type(self)
        for hook in (*_DISPATCHED, "choose_victim", "admit", "on_routed"):
            self.__dict__.pop(hook, None)   # a second assemble starts afresh
        direct: dict[str, Any] = {h: hooks[0] for h, hooks in self._by_hook.items() if len(hooks) == 1}
        direct["choose_victim"] = self.cache.choose_victim
        direct["admit"] = self.cache.admit
        if self.planner is not None:
            direct["on_routed"] = self.planner.on_routed
        for hook, fn in direct.items():
            if getattr(own, hook) is getattr(Composed, hook):
                setattr(self, hook, fn)

    def parts(self) -> list[Policy]:
        """The parts, in hook order."""
        return list(self._parts)

    def uses_hook(self, name: str) -> bool:
        """A hook is used when a subclass of the composition overrides it, or a part uses it."""
        own = getattr(type(self), name)
        if own is not getattr(Composed, name, None) and own is not getattr(Policy, name):
            return True
        return any(p.uses_hook(name) for p in self._parts)

    def parts_only(self) -> bool:
        """The composition overrides no hook of its own: it does exactly what its parts do (what
        a kernel standing in for the parts relies on, :mod:`moesim.policies.parts.kernel`)."""
        own = type(self)
        return all(getattr(own, h) is getattr(Composed, h) for h in _OWN)

    def demand_only(self) -> bool:
        """A cache rule that loads only on demand, with no prefetcher and at most a planner that
        declares itself demand-only too (it only substitutes or drops experts), in a composition
        that overrides no hook of its own."""
        if self.prefetcher is not None or not self.cache.demand_only():
            return False
        if self.planner is not None and not self.planner.demand_only():
            return False
        return self.parts_only()

    def required_columns(self) -> frozenset[str]:
        """Union of the parts' required columns."""
        return frozenset().union(*(p.required_columns() for p in self._parts))

    def read_columns(self) -> frozenset[str]:
        """Union of the parts' read columns."""
        return frozenset().union(*(p.read_columns() for p in self._parts))

    def report(self) -> dict[str, Any]:
        """The parts' reports, merged in hook order."""
        out: dict[str, Any] = {}
        for p in self._parts:
            out.update(p.report())
        return out

    def setup(self, ctx: Context) -> None:
        """Set up every part."""
        for p in self._parts:
            p.setup(ctx)

    def part_fractions(self, layer: int) -> tuple[float, ...]:
        """The cache rule's split of experts."""
        return self.cache.part_fractions(layer)

    def preload(self, ctx: Context) -> list[UnitKey]:
        """The parts' preloaded units, in hook order, each once."""
        out: dict[UnitKey, None] = {}
        for p in self._parts:
            out.update(dict.fromkeys(p.preload(ctx)))
        return list(out)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """Every part learns of the warm start."""
        for p in self._parts:
            p.warm(view, units)

    def on_iteration_start(self, view: View) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_iteration_start"]:
            hook(view)

    def before_layer(self, view: View, layer: int) -> None:
        """Every part, in order."""
        for hook in self._by_hook["before_layer"]:
            hook(view, layer)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """The planner's plan (as routed without one)."""
        return None if self.planner is None else self.planner.on_routed(view, layer, routing)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_access"]:
            hook(view, layer, outcome)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Every part, in order."""
        for hook in self._by_hook["after_layer"]:
            hook(view, layer, outcome)

    def on_layer_end(self, view: View, layer: int) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_layer_end"]:
            hook(view, layer)

    def on_iteration_end(self, view: View) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_iteration_end"]:
            hook(view)

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """The cache rule's victim."""
        return self.cache.choose_victim(view, request)

    def admit(self, view: ReadView, unit: UnitKey) -> bool:
        """The cache rule's admission."""
        return self.cache.admit(view, unit)

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_loaded"]:
            hook(view, unit, demand)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_evict"]:
            hook(view, unit)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """Every part, in order."""
        for hook in self._by_hook["on_cancel"]:
            hook(view, unit)
