"""Least-Stale, the eviction rule of SpecMD (Hoang, Jaiswal, Samragh, Cho; arXiv 2602.03921),
as far as it can be read: **an assumption**, stated here in full.

SpecMD's abstract says that expert access in an MoE model does not follow the temporal locality
LRU and LFU assume, and that Least-Stale "exploits MoE's predictable expert access patterns" to
cut collision misses by up to 85x over LRU. The paper's precise rule could not be read. What is
predictable without any predictor is the layer schedule: every layer runs once per token, in
order. The rule assumed here evicts, from one cache shared by all layers, the resident expert
whose layer comes round again last: at layer ``l`` of ``L``, the candidate of layer ``m`` is
``(m - l - 1) mod L`` layers away from its next chance of use, and the largest distance goes
first (so the current layer's unrouted experts, then the layer just run, ...); ties go to the
one used longest ago, then to the lowest (layer, expert, part). This is the reading of a
third-party port (``LeastStaleExpertCache``: stale = already passed in this token). It is
**causal**: it reads the fixed layer order and the past, not the recorded future (if every
resident expert were used when its layer next runs, it would be Belady's choice).

Not known from the paper and so not modelled: whether staleness is kept per layer or over a
global pool (a per-layer cache would make every candidate equally far, i.e. plain LRU: the rule
needs the shared pool), how prefetched but unused experts count, and how prefill batches and
ties are treated.
"""

from __future__ import annotations

from collections.abc import Sequence

from moesim.policies.contract.base import EvictionRequest, ReadView, UnitKey, VictimChoice
from moesim.policies.parts.caches import RecencyCache


class LeastStaleCache(RecencyCache):
    """Evict the expert whose layer runs again last (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._tables: dict[tuple[int, int], list[int]] = {}   # (current, layers) -> distance of each layer

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True

    @staticmethod
    def distance(layer: int, current: int, num_layers: int) -> int:
        """Layers until ``layer`` runs again, seen from ``current`` (0: the next one)."""
        return (layer - current - 1) % num_layers

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate farthest from its layer's next turn; then least recently used."""
        n = view.num_layers
        cur = view.layer if 0 <= view.layer < n else n - 1   # before layer 0 / after the last: layer 0 is next
        table = self._tables.get((cur, n))
        if table is None:
            table = self._tables[(cur, n)] = [self.distance(m, cur, n) for m in range(n)]
        # the greatest (distance, -last use, -key): first the farthest layer's candidates (one
        # pass), then among them the least recently used, the lowest key (keys are unique)
        best_d = -1
        first = candidates[0]
        group: list[UnitKey] | None = None
        for k in candidates:
            d = table[k[0]]
            if d > best_d:
                best_d, first, group = d, k, None
            elif d == best_d:
                if group is None:
                    group = [first, k]
                else:
                    group.append(k)
        if group is None:
            return first
        last = self._last
        best = group[0]
        best_last = last.get(best, 0)
        for k in group:
            used = last.get(k, 0)
            if used < best_last or (used == best_last and k < best):
                best, best_last = k, used
        return best
