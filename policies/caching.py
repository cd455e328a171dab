"""Demand caches: ``no-cache``, ``lru``, ``lfu``, ``fifo``, ``random`` and ``static``.

Each keeps per-unit bookkeeping and answers ``choose_victim``; none prefetches. Accesses are
recorded in ``after_layer`` in access order (tokens in order, each token's experts highest
probability first), the order in which a sequential cache simulator would see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.base import Outcome, Policy, UnitKey
from moesim.policies.registry import register

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine import EngineView, SimContext


class DemandCache(Policy):
    """Base of the recency/frequency caches: a logical clock advanced on every access, the
    time each resident unit was inserted and last used, and its in-cache access count."""

    def __init__(self) -> None:
        self._clock = 0
        self._inserted: dict[UnitKey, int] = {}
        self._last: dict[UnitKey, int] = {}
        self._count: dict[UnitKey, int] = {}
        self._parts = 1

    def setup(self, ctx: SimContext) -> None:
        self._clock = 0
        self._inserted.clear()
        self._last.clear()
        self._count.clear()

    def _touch(self, key: UnitKey) -> None:
        self._clock += 1
        if key not in self._inserted:
            self._inserted[key] = self._clock
            self._count[key] = 0
        self._last[key] = self._clock
        self._count[key] += 1

    def warm(self, view: EngineView, units: list[UnitKey]) -> None:
        for key in units:
            self._touch(key)

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        nparts = len(self.part_fractions(layer))
        for e in outcome.experts:
            for p in range(nparts):
                self._touch((layer, e, p))

    def _forget(self, unit: UnitKey) -> None:
        self._inserted.pop(unit, None)
        self._last.pop(unit, None)
        self._count.pop(unit, None)

    def on_evict(self, view: EngineView, unit: UnitKey) -> None:
        self._forget(unit)

    def on_cancel(self, view: EngineView, unit: UnitKey) -> None:
        self._forget(unit)   # a prefetch touched at issue time and withdrawn leaves no entry behind

    def _score(self, key: UnitKey) -> tuple[float, ...]:
        """Smallest score is evicted first."""
        raise NotImplementedError

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        return min(candidates, key=self._score) if candidates else None


@register
class LRU(DemandCache):
    """Least recently used."""

    name = "lru"
    summary = "evict the least recently used expert"

    def __init__(self) -> None:
        super().__init__()

    def _score(self, key: UnitKey) -> tuple[float, ...]:
        return (self._last.get(key, 0),)

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        # the hottest call of every LRU-based policy: skip the tuple of ``_score``
        if not candidates:
            return None
        last = self._last
        return min(candidates, key=lambda k: last.get(k, 0))


@register
class LFU(DemandCache):
    """Least frequently used, counting accesses since insertion (the count is forgotten on
    eviction); ties go to the unit whose count changed least recently."""

    name = "lfu"
    summary = "evict the least frequently used expert (in-cache count, LRU tie-break)"

    def __init__(self) -> None:
        super().__init__()

    def _score(self, key: UnitKey) -> tuple[float, ...]:
        return (self._count.get(key, 0), self._last.get(key, 0))


@register
class FIFO(DemandCache):
    """First in, first out: hits do not refresh."""

    name = "fifo"
    summary = "evict the expert loaded longest ago"

    def __init__(self) -> None:
        super().__init__()

    def _score(self, key: UnitKey) -> tuple[float, ...]:
        return (self._inserted.get(key, 0),)


@register
class RandomEviction(DemandCache):
    """Uniformly random victim among the unpinned residents."""

    name = "random"
    summary = "evict a random expert"

    def __init__(self) -> None:
        super().__init__()
        self._rng = np.random.default_rng(0)

    def setup(self, ctx: SimContext) -> None:
        super().setup(ctx)
        self._rng = ctx.rng

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        if not candidates:
            return None
        return candidates[int(self._rng.integers(len(candidates)))]


@register
class NoCache(Policy):
    """Load what each layer needs and keep nothing: every access is a demand load."""

    name = "no-cache"
    summary = "load each layer's experts on demand, drop them after use"

    def __init__(self) -> None:
        pass

    def before_layer(self, view: EngineView, layer: int) -> None:
        for key in view.resident_units():
            view.evict(*key)


@register
class Static(Policy):
    """Pin the most popular experts of each layer (from an offline profile of the replayed
    trace) and never evict them; other experts load on demand into the room left over,
    ``top_k`` experts' worth (or into ``cache.buffer_experts`` when that holds ``top_k``), and
    are the only victims."""

    name = "static"
    summary = "keep the most popular experts of each layer, stream the rest"

    def __init__(self, *, staging_experts: int | None = None) -> None:
        self.staging_experts = staging_experts
        self._static: set[UnitKey] = set()

    def setup(self, ctx: SimContext) -> None:
        assert ctx.expert_frequency is not None
        staging = self.staging_experts
        if staging is None:
            staging = 0 if ctx.buffer_bytes >= ctx.top_k * ctx.expert_bytes else ctx.top_k
        if staging < 0:
            raise ValueError("staging_experts must be >= 0")
        self._static = set()
        for layer in range(ctx.num_layers):
            cap = ctx.pool_capacity[0] // ctx.num_layers if len(ctx.pool_capacity) == 1 else ctx.pool_capacity[layer]
            slots = max(0, int(cap // ctx.expert_bytes) - staging)
            order = np.argsort(-ctx.expert_frequency[layer], kind="stable")[:slots]
            self._static.update((layer, int(e), 0) for e in order)
        self._budget_set = False

    def on_iteration_start(self, view: EngineView) -> None:
        if self._budget_set:
            return
        self._budget_set = True
        for key in sorted(self._static):
            view.prefetch(*key, priority=-1.0)

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        for key in candidates:
            if key not in self._static:
                return key
        return None

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        return None

    def warm(self, view: EngineView, units: list[UnitKey]) -> None:
        # a warm start that placed non-static experts: drop them so the static set can load
        for key in units:
            if key not in self._static:
                view.evict(*key)
