"""Demand caches: ``no-cache``, ``lru``, ``lfu``, ``fifo``, ``random`` and ``static``, each one
cache rule of :mod:`moesim.policies.parts.caches`; none prefetches."""

from __future__ import annotations

from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import (
    FIFOCache,
    LFUCache,
    LRUCache,
    NoKeepCache,
    RandomCache,
    StaticCache,
)
from moesim.policies.parts.compose import Composed


@register
class LRU(Composed):
    """Least recently used."""

    name = "lru"
    setup_needs = SetupNeeds()
    summary = "evict the least recently used expert"

    def __init__(self) -> None:
        self.assemble(cache=LRUCache())


@register
class LFU(Composed):
    """Least frequently used, counting accesses since insertion (forgotten on eviction); ties go
    to the unit whose count changed least recently."""

    name = "lfu"
    setup_needs = SetupNeeds()
    summary = "evict the least frequently used expert (in-cache count, LRU tie-break)"

    def __init__(self) -> None:
        self.assemble(cache=LFUCache())


@register
class FIFO(Composed):
    """First in, first out: hits do not refresh."""

    name = "fifo"
    setup_needs = SetupNeeds()
    summary = "evict the expert loaded longest ago"

    def __init__(self) -> None:
        self.assemble(cache=FIFOCache())


@register
class RandomEviction(Composed):
    """Uniformly random victim among the unpinned residents."""

    name = "random"
    setup_needs = SetupNeeds()
    summary = "evict a random expert"

    def __init__(self) -> None:
        self.assemble(cache=RandomCache())


@register
class NoCache(Composed):
    """Load what each layer needs and keep nothing: every access is a demand load."""

    name = "no-cache"
    setup_needs = SetupNeeds()
    summary = "load each layer's experts on demand, drop them after use"

    def __init__(self) -> None:
        self.assemble(cache=NoKeepCache())


@register
class Static(Composed):
    """Pin the most popular experts of each layer (offline popularity from the ``profile:``
    split, or, without one, from the replayed requests: an optimistic profile the run warns
    about); other experts stream through ``staging_experts`` slots (default ``top_k``)."""

    name = "static"
    setup_needs = SetupNeeds(profile_share=DEFAULT_PROFILE_SHARE,
                             source="moesim: popularity from requests other than the replayed ones")
    summary = "keep the most popular experts of each layer, stream the rest"

    def __init__(self, *, staging_experts: int | None = None) -> None:
        self.staging_experts = staging_experts
        self.assemble(cache=StaticCache(staging_experts))
