"""fMoE: fine-grained expert offloading with expert maps (Yu et al., "fMoE: Fine-Grained Expert
Offloading for Large Mixture-of-Experts Serving", 2025). Lossless, one global expert cache.

An Expert Map Store keeps up to ``store_capacity`` (C, 1K in the paper) past iterations' router
probabilities for every layer and their semantic embeddings, pre-filled from the scenario's
``profile:`` split (the paper's 7:3 history). Before each iteration the most similar embedding
picks a map for layers ``0..d-1``; after each routed layer the most similar probability
trajectory picks one for layer ``l + d`` (``prefetch_distance`` d, 3 in the paper). Experts are
prefetched in descending probability until their mass reaches ``clip(1 - score, 0, 1)`` and at
least K, at priority ``p / distance``; demand misses go first. The cache evicts the highest
``1 / (p * freq)``. See :mod:`moesim.policies.fmoe.map_prefetch`,
:mod:`moesim.policies.fmoe.map_cache` and :mod:`moesim.policies.fmoe.expert_maps` for the
readings taken where the paper is silent (the spec sheet's [rec]: ``freq + 1``, the protected
window of the next d layers, withdrawing stale prefetches, ``>= K``).

Ablations (Fig. 12): ``matcher`` = ``map`` (fMoE), ``speculate`` (the next router's guess from
``lookahead_logits``, distance 1) or ``hit-count`` (request-level activation counts,
MoE-Infinity's matcher); with ``map``, ``semantic=False`` is Map(T), ``dynamic_threshold=False``
Map(T+S), both on the full Map(T+S+delta). ``eviction`` = ``fmoe``, ``lru`` or ``lfu`` (Fig. 12b).
``match_us`` is the CPU time of one map search, charged on the critical path (the paper runs it
in a thread; Fig. 15 counts it outside the synchronous overhead), 0 to leave it out.
``trajectory_span``: ``target`` (default, the paper's text: a trajectory match prefetches layer
``l + d``) or ``rest`` (the authors' code: layers ``l + d .. L - 1``; see
:mod:`moesim.policies.fmoe.map_prefetch`).
"""

from __future__ import annotations

from moesim.policies.baselines.moe_infinity import EAMPrefetcher
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.fmoe.map_cache import MapPriorityCache
from moesim.policies.fmoe.map_prefetch import ExpertMapPrefetcher
from moesim.policies.parts.caches import CacheRule, LFUCache, LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import make_predictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher, Prefetcher

MATCHERS = ("map", "speculate", "hit-count")
EVICTIONS = ("fmoe", "lru", "lfu")


@register
class FMoE(Composed):
    """Expert-map prefetch and map-weighted LFU eviction in one global cache."""

    name = "fmoe"
    summary = "fMoE: semantic + trajectory expert-map matching prefetch, 1/(p*freq) eviction, global cache"
    paper = "Yu et al., fMoE: Fine-Grained Expert Offloading for Large Mixture-of-Experts Serving (2025)"
    scope = "global"
    setup_needs = SetupNeeds(columns=frozenset({"logits", "embedding"}), profile_share=0.7,
                             source="fMoE section 6.1: expert maps of router probabilities and semantic "
                                    "embeddings, a 7:3 history split")

    def __init__(self, *, prefetch_distance: int = 3, store_capacity: int = 1000, semantic: bool = True,
                 trajectory: bool = True, dynamic_threshold: bool = True, matcher: str = "map",
                 eviction: str = "fmoe", freq_smoothing: float = 1.0, protect_window: bool = True,
                 cancel_stale: bool = True, reprioritize: bool = True, match_us: float = 50.0,
                 trajectory_span: str = "target") -> None:
        if matcher not in MATCHERS:
            raise ValueError(f"matcher must be one of {', '.join(MATCHERS)}, got {matcher!r}")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {', '.join(EVICTIONS)}, got {eviction!r}")
        self.prefetch_distance = prefetch_distance
        self.store_capacity = store_capacity
        self.semantic = semantic
        self.trajectory = trajectory
        self.dynamic_threshold = dynamic_threshold
        self.matcher = matcher
        self.eviction = eviction
        self.freq_smoothing = freq_smoothing
        self.protect_window = protect_window
        self.cancel_stale = cancel_stale
        self.reprioritize = reprioritize
        self.match_us = match_us
        self.trajectory_span = trajectory_span
        maps = ExpertMapPrefetcher(
            prefetch_distance=prefetch_distance, store_capacity=store_capacity, semantic=semantic,
            trajectory=trajectory, dynamic_threshold=dynamic_threshold, cancel_stale=cancel_stale,
            reprioritize=reprioritize, match_us=match_us, trajectory_span=trajectory_span)
        prefetcher: Prefetcher
        if matcher == "map":
            prefetcher = maps
        elif matcher == "speculate":
            prefetcher = NextLayerPrefetcher(make_predictor("auto"), cross_token=True)
        else:
            prefetcher = EAMPrefetcher(store_capacity, None, prefetch_distance)
        cache: CacheRule
        if eviction == "fmoe":
            cache = MapPriorityCache(freq_smoothing, protect_window,
                                     maps=maps if matcher == "map" else None)
        else:
            cache = LRUCache() if eviction == "lru" else LFUCache()
        self.assemble(cache=cache, prefetcher=prefetcher)

    def needs(self) -> SetupNeeds:
        """The history split always; the map matcher reads router logits (and embeddings when
        ``semantic``), the ``speculate`` matcher the lookahead, ``hit-count`` no column."""
        needs = super().needs()
        if self.matcher == "map":
            return needs if self.semantic else needs.without(columns={"embedding"})
        columns = frozenset({"lookahead_logits"}) if self.matcher == "speculate" else frozenset()
        return SetupNeeds(columns=columns, profile_share=needs.profile_share, source=needs.source)
