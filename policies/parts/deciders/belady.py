"""Belady's MIN as a decider: the victim is the unpinned resident whose next use lies
farthest ahead."""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from moesim.policies.parts.deciders.base import LayerDecider, PoolStart


class BeladyDecider(LayerDecider):
    """Belady's MIN: the victim is the unpinned resident whose next use lies farthest ahead
    (never used again: the lowest expert id first), as ``BeladyCache`` picks it from the oracle
    annotation. Next uses are positions in the layer's whole access sequence (steps in order,
    each step's experts in access order), the order of the annotation's keys."""

    name = "belady"

    def __init__(self, start: PoolStart) -> None:
        flat = start.sequences()
        # next_use[l][p]: the position of the next access of the expert accessed at p
        self.next_use: list[np.ndarray] = []
        self.first_use: list[dict[int, int]] = []
        self.never = max((len(f) for f in flat), default=0) + 1
        for f in flat:
            order = np.argsort(f, kind="stable")
            nxt = np.full(len(f), self.never, dtype=np.int64)
            same = f[order[1:]] == f[order[:-1]]
            nxt[order[:-1][same]] = order[1:][same]
            self.next_use.append(nxt)
            starts = np.ones(len(f), dtype=bool)
            starts[1:] = ~same
            self.first_use.append(dict(zip(f[order[starts]].tolist(), order[starts].tolist(), strict=True)))
        self.pos = [0] * len(start.slots)
        super().__init__(start)

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """Each resident's next use, and the heap of ``(-next use, expert)``."""
        first = self.first_use[layer]
        nu = {e: first.get(e, self.never) for e in experts}
        heap = [(-u, e) for e, u in nu.items()]
        heapq.heapify(heap)
        return nu, heap

    def resident(self) -> int:
        """Experts resident in all pools now."""
        return sum(len(p[0]) for p in self.pools)

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`.Decider.plan`."""
        nu, heap = self.pools[layer]
        cap = self.slots[layer]
        evicted = self.evicted[layer]
        p = self.pos[layer]
        n_acc = sum(len(x) for x in seq)
        nxt = self.next_use[layer][p:p + n_acc].tolist()
        self.pos[layer] = p + n_acc
        push, pop = heapq.heappush, heapq.heappop
        last_out = evicted.get
        L = self.L
        k = layer - L
        j = 0
        refetch = 0
        for s, exps in enumerate(seq):
            k += L
            miss = None
            for e in exps:
                if e not in nu:
                    if miss is None:
                        miss = [e]
                        prev = idxs[s] - 1
                    else:
                        miss.append(e)
                    if last_out(e, -2) >= prev:   # evicted in the previous iteration
                        refetch += 1
            if miss is not None:
                over = len(nu) + len(miss) - cap
                if over > 0:
                    idx = idxs[s]
                    held = []
                    n = 0
                    while n < over:
                        negu, v = pop(heap)
                        if nu.get(v) != -negu:
                            continue   # stale
                        if v in exps:
                            held.append((negu, v))
                            continue
                        del nu[v]
                        evicted[v] = idx
                        n += 1
                    for x in held:
                        push(heap, x)
                    evictions[k] = over
                misses[k] = miss
            for e in exps:
                u = nxt[j]
                j += 1
                nu[e] = u
                push(heap, (-u, e))
        if len(heap) > 4 * len(nu) + 64:   # drop the stale entries
            heap[:] = [(-u, e) for e, u in nu.items()]
            heapq.heapify(heap)
        return refetch
