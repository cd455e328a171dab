"""Cache rules: which resident expert leaves when room is needed, and what the cache remembers.

Every rule is a :class:`CacheRule`: it answers ``choose_victim`` (never naming a member of the
set a prefetcher protects at that moment), may ``refresh`` a unit (count it as used now, for a
prefetcher whose set is already present), and keeps its state through ``on_access``,
``on_evict`` and ``on_cancel``. Used alone, a rule is a complete demand-caching policy.

Accesses are recorded in ``on_access``, in access order (tokens in order, each token's experts
highest probability first): the order a sequential cache simulator would see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    FutureRouting,
    Outcome,
    Policy,
    ReadView,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.parts.deciders.base import Decider, PoolStart
from moesim.policies.parts.deciders.belady import BeladyDecider
from moesim.policies.parts.deciders.fifo import FifoDecider, StaticDecider
from moesim.policies.parts.deciders.lfu import LfuDecider
from moesim.policies.parts.deciders.lru import LruDecider
from moesim.policies.parts.deciders.random import RandomDecider
from moesim.policies.parts.kernel import DeclaresKernel
from moesim.policies.parts.lcp_priority import CachePriority


class CacheRule(Policy, DeclaresKernel):
    """Base of the cache rules: victims among the request's candidates minus ``protected``.

    A rule whose decisions on a demand-only run a vectorised decision function reproduces
    declares it as its ``decider`` (:mod:`moesim.policies.parts.deciders`); the fast path's cache
    kernel then replays the rule with it, and the rule's ``kernel``
    (:mod:`moesim.policies.parts.kernel`) is the decider's name. As ``kernel``, a declaration
    holds only for the class that makes it."""

    decider: ClassVar[type[Decider] | None] = None
    """The decider that reproduces this class exactly on a demand-only run (None: none does)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "kernel" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: a cache rule declares its decider, whose name is its kernel")
        super().__init_subclass__(**kwargs)
        if "decider" not in cls.__dict__:
            cls.decider = None
        cls.kernel = None if cls.decider is None else cls.decider.name

    def __init__(self) -> None:
        self.protected: frozenset[UnitKey] = frozenset()

    def new_decider(self, start: PoolStart) -> Decider | None:
        """This rule's decider for a run whose pools start at ``start``, or None when the class
        declares none. A decider that needs the rule's state (a random stream, a pinned set)
        is built by the rule's override."""
        cls = self.decider
        return None if cls is None else cls(start)

    def read_columns(self) -> frozenset[str]:
        """Cache rules read only the routing (``experts``)."""
        return self.required_columns()

    def refresh(self, key: UnitKey) -> None:
        """``key`` counts as used now (a prefetcher found it present, or issued it)."""

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """The rule's victim among the candidates that are not protected."""
        cands = request.candidates
        protected = self.protected
        if protected:
            kept = []   # a plain loop: a comprehension is a call of its own, and the list is short
            for k in cands:
                if k not in protected:
                    kept.append(k)
            cands = kept
        if not cands:
            return request.decline
        return self.victim(view, request, cands)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """Pick among ``candidates`` (not empty). Default: the first."""
        return candidates[0]


class RecencyCache(CacheRule):
    """Bookkeeping of the recency/frequency rules: a logical clock advanced on every access, the
    time each unit was inserted and last used, and its in-cache access count (forgotten when it
    leaves)."""

    def __init__(self) -> None:
        super().__init__()
        self._clock = 0
        self._inserted: dict[UnitKey, int] = {}
        self._last: dict[UnitKey, int] = {}
        self._count: dict[UnitKey, int] = {}

    def setup(self, ctx: Context) -> None:
        """Forget everything."""
        self._clock = 0
        self._inserted.clear()
        self._last.clear()
        self._count.clear()

    def refresh(self, key: UnitKey) -> None:
        """Record an access of ``key`` now."""
        clock = self._clock = self._clock + 1
        if key in self._inserted:   # _inserted and _count hold the same keys
            self._count[key] += 1
        else:
            self._inserted[key] = clock
            self._count[key] = 1
        self._last[key] = clock

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """Warm-start units count as accessed, in order."""
        for key in units:
            self.refresh(key)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Record the layer's GPU accesses in order."""
        nparts = len(self.part_fractions(layer))
        if nparts == 1 and type(self).refresh is RecencyCache.refresh:
            # refresh((layer, e, 0)) for each expert, inlined (once per layer)
            clock, ins, last, count = self._clock, self._inserted, self._last, self._count
            for e in outcome.experts:
                key = (layer, e, 0)
                clock += 1
                if key in ins:
                    count[key] += 1
                else:
                    ins[key] = clock
                    count[key] = 1
                last[key] = clock
            self._clock = clock
            return
        for e in outcome.experts:
            for p in range(nparts):
                self.refresh((layer, e, p))

    def last_used(self, key: UnitKey) -> int:
        """Logical time of ``key``'s last access (0 if none)."""
        return self._last.get(key, 0)

    def last_uses(self) -> dict[UnitKey, int]:
        """Logical time of the last access of every unit the rule remembers (a copy)."""
        return dict(self._last)

    @property
    def clock(self) -> int:
        """The logical clock: accesses recorded so far (the time of the latest)."""
        return self._clock

    def _forget(self, unit: UnitKey) -> None:
        self._inserted.pop(unit, None)
        self._last.pop(unit, None)
        self._count.pop(unit, None)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """An evicted unit's counts are forgotten."""
        self._inserted.pop(unit, None)   # self._forget(unit), inlined: once per eviction
        self._last.pop(unit, None)
        self._count.pop(unit, None)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """A prefetch refreshed at issue and withdrawn leaves no entry behind."""
        self._forget(unit)


class LRUCache(RecencyCache):
    """Least recently used. Its victims read only the last uses, so it keeps only them and the
    clock: the insertion times and access counts :class:`RecencyCache` keeps for the other
    rules would never be read (the same victims, less work on every access and eviction)."""

    decider = LruDecider

    def refresh(self, key: UnitKey) -> None:
        """Record an access of ``key`` now (its last use)."""
        clock = self._clock = self._clock + 1
        self._last[key] = clock

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Record the layer's GPU accesses in order."""
        if type(self).refresh is not LRUCache.refresh or len(self.part_fractions(layer)) != 1:
            super().on_access(view, layer, outcome)   # by parts, or through a subclass's refresh
            return
        # refresh((layer, e, 0)) for each expert, inlined (once per layer)
        clock, last = self._clock, self._last
        for e in outcome.experts:
            clock += 1
            last[(layer, e, 0)] = clock
        self._clock = clock

    def _forget(self, unit: UnitKey) -> None:
        self._last.pop(unit, None)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """An evicted unit's last use is forgotten."""
        self._last.pop(unit, None)

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate used longest ago."""
        n = len(candidates)
        if n == 1:   # a small pool's common cases: no key function to call
            return candidates[0]
        last = self._last
        if n == 2:   # min keeps the first of equal keys
            a, b = candidates
            return b if last.get(b, 0) < last.get(a, 0) else a
        return min(candidates, key=lambda k: last.get(k, 0))


class LFUCache(RecencyCache):
    """Least frequently used, counting accesses since insertion; ties to the unit whose count
    changed least recently (libCacheSim's LFU). Its victims read the counts and last uses only,
    so it keeps only them and the clock (not the insertion times, which it would never read)."""

    decider = LfuDecider

    def refresh(self, key: UnitKey) -> None:
        """Record an access of ``key`` now (one more use, the last)."""
        clock = self._clock = self._clock + 1
        count = self._count
        count[key] = count.get(key, 0) + 1
        self._last[key] = clock

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Record the layer's GPU accesses in order."""
        if type(self).refresh is not LFUCache.refresh or len(self.part_fractions(layer)) != 1:
            super().on_access(view, layer, outcome)   # by parts, or through a subclass's refresh
            return
        # refresh((layer, e, 0)) for each expert, inlined (once per layer)
        clock, last, count = self._clock, self._last, self._count
        for e in outcome.experts:
            key = (layer, e, 0)
            clock += 1
            count[key] = count.get(key, 0) + 1
            last[key] = clock
        self._clock = clock

    def _forget(self, unit: UnitKey) -> None:
        self._last.pop(unit, None)
        self._count.pop(unit, None)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """An evicted unit's count and last use are forgotten."""
        self._last.pop(unit, None)
        self._count.pop(unit, None)

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True


    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate of fewest accesses since it came in."""
        count, last = self._count, self._last
        if len(candidates) == 2:   # a small pool's common case: min keeps the first of equal keys
            a, b = candidates
            ca, cb = count.get(a, 0), count.get(b, 0)
            return b if cb < ca or (cb == ca and last.get(b, 0) < last.get(a, 0)) else a
        return min(candidates, key=lambda k: (count.get(k, 0), last.get(k, 0)))


class FIFOCache(RecencyCache):
    """First in, first out: hits do not refresh the order."""

    decider = FifoDecider

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate inserted longest ago."""
        ins = self._inserted
        return min(candidates, key=lambda k: ins.get(k, 0))


class RandomCache(RecencyCache):
    """A uniformly random victim (from the run's policy random stream)."""

    decider = RandomDecider

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True


    def __init__(self) -> None:
        super().__init__()
        self._rng = np.random.default_rng(0)

    def setup(self, ctx: Context) -> None:
        """Take the run's random stream."""
        super().setup(ctx)
        self._rng = ctx.rng

    @property
    def rng(self) -> np.random.Generator:
        """The stream victims are drawn from (the run's policy stream, after ``setup``)."""
        return self._rng

    def new_decider(self, start: PoolStart) -> Decider | None:
        """The decider draws from the rule's own stream."""
        return RandomDecider(start, self._rng) if self.decider is RandomDecider else super().new_decider(start)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """A random candidate."""
        return candidates[int(self._rng.integers(len(candidates)))]


class NoKeepCache(CacheRule):
    """Keeps nothing: every resident unit is evicted before each layer, so every access loads."""

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True

    def before_layer(self, view: View, layer: int) -> None:
        """Evict every resident unit."""
        for key in view.resident_units():
            view.evict(*key)


class StaticCache(CacheRule):
    """Pins the most popular experts of each layer (offline popularity: the profile split, or the
    replayed requests when none is given) and never evicts them; other experts load on demand
    into the room left, ``staging_experts`` (default ``top_k``, 0 when the transfer buffer holds
    ``top_k``), and are the only victims."""

    decider = StaticDecider

    def __init__(self, staging_experts: int | None = None) -> None:
        super().__init__()
        if staging_experts is not None and staging_experts < 0:
            raise ValueError("staging_experts must be >= 0")
        self.staging_experts = staging_experts
        self.static: set[UnitKey] = set()
        self._loaded = False

    def setup(self, ctx: Context) -> None:
        """Choose the static set."""
        freq = ctx.offline_frequency()
        staging = self.staging_experts
        if staging is None:
            staging = 0 if ctx.buffer_bytes >= ctx.top_k * ctx.expert_bytes else ctx.top_k
        self.static = set()
        for layer in range(ctx.num_layers):
            cap = (ctx.pool_capacity[0] // ctx.num_layers if len(ctx.pool_capacity) == 1
                   else ctx.pool_capacity[layer])
            slots = max(0, int(cap // ctx.expert_bytes) - staging)
            order = np.argsort(-freq[layer], kind="stable")[:slots]
            self.static.update((layer, int(e), 0) for e in order)
        self._loaded = False

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """A warm start that placed non-static experts: drop them so the static set can load."""
        for key in units:
            if key not in self.static:
                view.evict(*key)

    def on_iteration_start(self, view: View) -> None:
        """Load the static set once, behind every demand load."""
        if self._loaded:
            return
        self._loaded = True
        for key in sorted(self.static):
            view.prefetch(*key, priority=-1.0)

    def static_experts(self, num_layers: int) -> list[set[int]]:
        """Each layer's static experts (after ``setup``)."""
        sets: list[set[int]] = [set() for _ in range(num_layers)]
        for layer, e, _p in self.static:
            sets[layer].add(e)
        return sets

    def new_decider(self, start: PoolStart) -> Decider | None:
        """FIFO beside the static set, which the kernel takes only when it is resident at the
        start (:mod:`moesim.sim.fast.kernel_choice`)."""
        if self.decider is not StaticDecider:
            return super().new_decider(start)
        return StaticDecider(start, self.static_experts(len(start.slots)))

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The first candidate outside the static set, else none."""
        for key in candidates:
            if key not in self.static:
                return key
        return request.decline


class BeladyCache(CacheRule):
    """Belady's MIN: evict the unit whose next use lies farthest in the future (ties: the lowest
    key). Reads the recorded routing of later steps through ``ctx.future``: an oracle."""

    decider = BeladyDecider

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True


    def __init__(self) -> None:
        super().__init__()
        self._future: FutureRouting | None = None

    def setup(self, ctx: Context) -> None:
        """Take the oracle annotation."""
        if ctx.future is None:
            raise RuntimeError("the Belady rule needs the oracle annotation (an oracle policy)")
        self._future = ctx.future

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate used farthest in the future."""
        fut = self._future
        assert fut is not None
        now = fut.step_key(view.iteration_index, max(view.layer, 0))
        return max(candidates, key=lambda k: (fut.next_use(k[0], k[1], now), -k[0], -k[1], -k[2]))


class LCPCache(CacheRule):
    """MoEpic's Least Cache Priority: evict the expert of least ``mu * rho^(nu / omega)`` (Eq. 4);
    priorities count every token's routing, resident or not."""

    def __init__(self, rho: float = 0.25, omega: float = 128.0) -> None:
        super().__init__()
        self.prio = CachePriority(1, 1, rho=rho, omega=omega)   # checks rho and omega
        self.rho = rho
        self.omega = omega

    def setup(self, ctx: Context) -> None:
        """Fresh indicators for the model's shape."""
        self.prio = CachePriority(ctx.num_layers, ctx.num_experts, rho=self.rho, omega=self.omega)

    def demand_only(self) -> bool:
        """It loads on demand only, and always names a victim while a candidate is left."""
        return True

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Every token that passed the layer updates the indicators."""
        self.prio.observe(layer, outcome.plan)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate of least priority."""
        return self.prio.victim(list(candidates))


class DropAfterUseCache(CacheRule):
    """Keeps nothing past its use: a layer's units leave before the next layer starts (and the
    last layer's at the end of the iteration); staged units are never admitted."""

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """Drop a warm start."""
        for key in units:
            view.evict(*key)

    def _clear(self, view: View, layer: int) -> None:
        for key in view.units_of_layer(layer):
            view.evict(*key)   # only resident, unpinned units go; transfers in flight stay

    def before_layer(self, view: View, layer: int) -> None:
        """Drop the previous layer's units."""
        if layer > 0:
            self._clear(view, layer - 1)

    def on_iteration_end(self, view: View) -> None:
        """Drop the last layer's units."""
        self._clear(view, view.num_layers - 1)

    def admit(self, view: ReadView, unit: UnitKey) -> bool:
        """Never keep a staged unit."""
        return False
