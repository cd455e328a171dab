"""LRU caches with next-layer prefetch: ``mixtral-offloading`` (speculative, from the
router's lookahead) and ``oracle-prefetch`` (perfect knowledge of the next layer: a bound)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.base import Outcome, UnitKey
from moesim.policies.caching import LRU
from moesim.policies.registry import register

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine import EngineView, SimContext
    from moesim.sim.workload import Future

PREDICTORS = ("auto", "lookahead", "previous-token")


def top_experts(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Union over tokens of each token's ``k`` best experts by ``scores`` (``[n, E]``), ordered
    by the best score any token gives them (descending, then expert id)."""
    scores = np.asarray(scores, dtype=np.float32)
    k = min(k, scores.shape[1])
    if scores.shape[0] == 1:  # the common batch-1 case: plain Python beats numpy on one row
        row = scores[0].tolist()
        return [(e, row[e]) for e in heapq.nlargest(k, range(len(row)), key=row.__getitem__)]
    best: dict[int, float] = {}
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    for t in range(scores.shape[0]):
        for e in idx[t]:
            v = float(scores[t, e])
            if v > best.get(int(e), -np.inf):
                best[int(e)] = v
    return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))


class PrefetchingLRU(LRU):
    """An LRU cache that prefetches sets of experts for a coming layer without undermining
    itself: experts of the set that are already present count as used now (they become most
    recent), and no prefetch of the set may evict another member of the set (a prefetch that
    would have to is dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self._protect: frozenset[UnitKey] = frozenset()

    def prefetch_set(self, view: EngineView, layer: int, experts: list[tuple[int, float]]) -> int:
        """Prefetch ``(expert, score)`` pairs for ``layer`` in the given order (higher score
        first in the lane); returns how many transfers were issued."""
        keys = [(layer, e, 0) for e, _ in experts]
        for key in keys:
            if view.is_present(*key):
                self._touch(key)
        self._protect = frozenset(keys)
        issued = 0
        try:
            for key, (_, score) in zip(keys, experts, strict=True):
                if not view.is_present(*key) and view.prefetch(*key, priority=score):
                    self._touch(key)
                    issued += 1
        finally:
            self._protect = frozenset()
        return issued

    def choose_victim(self, view: EngineView, pool: int, candidates: list[UnitKey],
                      need_bytes: int) -> UnitKey | None:
        if self._protect:
            candidates = [k for k in candidates if k not in self._protect]
        return super().choose_victim(view, pool, candidates, need_bytes)


@register
class MixtralOffloading(PrefetchingLRU):
    """LRU expert cache per layer plus speculative prefetch of the next layer's experts
    (Eliseev & Mazur, 2023): when layer ``l`` is routed, the router of ``l + 1`` applied to the
    hidden state of ``l`` (the trace's ``lookahead_logits``) guesses the next experts, which
    load into the next layer's LRU cache in the background.

    ``prefetch_experts`` experts per token are guessed (default ``top_k``). ``predictor``:
    ``lookahead`` needs ``lookahead_logits``; ``previous-token`` guesses the previous token's
    routing of layer ``l + 1``; ``auto`` takes lookahead when the trace has it.
    ``cross_token`` also prefetches layer 0 of the next iteration from the last layer.
    """

    name = "mixtral-offloading"
    summary = "LRU + speculative next-layer prefetch from the router lookahead"

    def __init__(self, *, prefetch_experts: int | None = None, predictor: str = "auto",
                 cross_token: bool = False) -> None:
        super().__init__()
        if predictor not in PREDICTORS:
            raise ValueError(f"predictor must be one of {', '.join(PREDICTORS)}, got {predictor!r}")
        if prefetch_experts is not None and prefetch_experts < 0:
            raise ValueError("prefetch_experts must be >= 0")
        self.prefetch_experts = prefetch_experts
        self.predictor = predictor
        self.cross_token = cross_token
        self._k = 0
        self._E = 0
        self._use_lookahead = True

    def setup(self, ctx: SimContext) -> None:
        super().setup(ctx)
        self._k = ctx.top_k if self.prefetch_experts is None else self.prefetch_experts
        self._E = ctx.num_experts
        if self.predictor == "lookahead" and not ctx.has_lookahead:
            raise ValueError("predictor 'lookahead' needs lookahead_logits in the trace")
        self._use_lookahead = self.predictor == "lookahead" or (self.predictor == "auto" and ctx.has_lookahead)

    def _guess(self, view: EngineView, layer: int) -> list[tuple[int, float]]:
        """Experts of ``layer + 1`` (layer 0 of the next iteration after the last) and scores."""
        L = view.num_layers
        if self._use_lookahead:
            logits = view.lookahead_logits(layer)
            assert logits is not None
            return top_experts(logits, self._k)
        prev = view.previous_routing((layer + 1) % L) if layer + 1 < L else view.routing(0).experts
        if prev is None:
            return []
        scores = np.zeros((prev.shape[0], self._E), dtype=np.float32)
        for t in range(prev.shape[0]):
            scores[t, prev[t]] = np.arange(prev.shape[1], 0, -1)
        return top_experts(scores, self._k)

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        super().after_layer(view, layer, outcome)
        if self._k == 0:
            return
        L = view.num_layers
        if layer + 1 < L:
            target = layer + 1
        elif self.cross_token:
            target = 0
        else:
            return
        self.prefetch_set(view, target, self._guess(view, layer))


@register
class OraclePrefetch(PrefetchingLRU):
    """LRU cache plus a perfect next-layer prefetcher: after layer ``l`` is routed it loads
    exactly the experts the recorded routing uses at ``l + 1`` (and at layer 0 of the next
    iteration). Reads the future: the bound for next-layer prefetchers."""

    name = "oracle-prefetch"
    oracle = True
    summary = "oracle: LRU + exact next-layer prefetch (bound for prefetchers)"

    def __init__(self) -> None:
        super().__init__()
        self._future: Future | None = None

    def setup(self, ctx: SimContext) -> None:
        super().setup(ctx)
        self._future = ctx.future

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        super().after_layer(view, layer, outcome)
        fut = self._future
        assert fut is not None
        L = view.num_layers
        it = view.iteration_index
        nxt_it, target = (it, layer + 1) if layer + 1 < L else (it + 1, 0)
        routing = fut.routing(nxt_it, target).reshape(-1).tolist()
        order = list(dict.fromkeys(int(e) for e in routing))   # access order, first occurrence
        self.prefetch_set(view, target, [(e, float(-rank)) for rank, e in enumerate(order)])
