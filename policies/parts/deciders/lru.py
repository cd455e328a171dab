"""The LRU rule's decider: the victim is the unpinned resident used longest ago."""

from __future__ import annotations

from typing import Any

from moesim.policies.parts.deciders.base import LayerDecider


class LruDecider(LayerDecider):
    """LRU: the victim is the unpinned resident used longest ago."""

    name = "lru"

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`.Decider.plan`. The step's experts go last in access order first (hits
        moved, misses added); the victims are then the oldest entries, none of them pinned."""
        pool = self.pools[layer]
        cap = self.slots[layer]
        evicted = self.evicted[layer]
        last_out = evicted.get
        to_end = pool.move_to_end
        pop = pool.popitem
        L = self.L
        k = layer - L
        refetch = 0
        for s, exps in enumerate(seq):
            k += L
            miss = None
            for e in exps:
                if e in pool:
                    to_end(e)
                else:
                    pool[e] = None
                    if miss is None:
                        miss = [e]
                        prev = idxs[s] - 1
                    else:
                        miss.append(e)
                    if last_out(e, -2) >= prev:   # evicted in the previous iteration
                        refetch += 1
            if miss is None:
                continue
            over = len(pool) - cap
            if over > 0:
                idx = idxs[s]
                for _ in range(over):
                    evicted[pop(False)[0]] = idx
                evictions[k] = over
            misses[k] = miss
        return refetch
