"""The LFU rule's decider: the victim is the unpinned resident of fewest accesses since it
came in, ties to the one whose count changed least recently."""

from __future__ import annotations

import heapq
from typing import Any

from moesim.policies.parts.deciders.base import LayerDecider


class _LfuPool:
    """One pool of LFU: each resident's in-cache access count and last access time (a clock of
    the pool's own accesses: only times of one pool are compared) and a heap of ``(count, last,
    expert)`` whose stale entries are skipped. The victim is the unpinned resident of least
    ``(count, last)``, as ``LFUCache.victim`` picks it."""

    __slots__ = ("t", "count", "last", "heap")

    def __init__(self, experts: list[int]) -> None:
        self.t = 0
        self.count: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.heap: list[tuple[int, int, int]] = []
        self.access(experts)

    def __contains__(self, e: int) -> bool:
        return e in self.count

    def __len__(self) -> int:
        return len(self.count)

    def access(self, exps: list[int]) -> None:
        """Accesses in order: a new expert starts at count 1, a resident one counts one more."""
        count, last, heap = self.count, self.last, self.heap
        t = self.t
        for e in exps:
            t += 1
            c = count.get(e, 0) + 1
            count[e] = c
            last[e] = t
            heapq.heappush(heap, (c, t, e))
        self.t = t
        if len(heap) > 4 * len(count) + 64:   # drop the stale entries
            self.heap = [(count[e], last[e], e) for e in count]
            heapq.heapify(self.heap)


class LfuDecider(LayerDecider):
    """LFU: the victim is the unpinned resident of fewest accesses since it came in, ties to
    the one whose count changed least recently."""

    name = "lfu"

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """A heap-kept pool (warm-start experts count as accessed, in order)."""
        return _LfuPool(experts)

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`.Decider.plan` (the pool's bookkeeping inlined: this loop is the kernel)."""
        pool = self.pools[layer]
        count, last, heap = pool.count, pool.last, pool.heap
        t = pool.t
        push, pop = heapq.heappush, heapq.heappop
        cap = self.slots[layer]
        evicted = self.evicted[layer]
        last_out = evicted.get
        L = self.L
        k = layer - L
        refetch = 0
        for s, exps in enumerate(seq):
            k += L
            miss = None
            for e in exps:
                if e not in count:
                    if miss is None:
                        miss = [e]
                        prev = idxs[s] - 1
                    else:
                        miss.append(e)
                    if last_out(e, -2) >= prev:   # evicted in the previous iteration
                        refetch += 1
            if miss is not None:
                over = len(count) + len(miss) - cap
                if over > 0:
                    if len(heap) > 4 * len(count) + 64:   # drop the stale entries
                        heap[:] = [(count[e], last[e], e) for e in count]
                        heapq.heapify(heap)
                    idx = idxs[s]
                    held = []
                    n = 0
                    while n < over:   # the least (count, last) that is current and unpinned
                        c, tc, v = pop(heap)
                        if count.get(v) != c or last[v] != tc:
                            continue
                        if v in exps:
                            held.append((c, tc, v))
                            continue
                        del count[v]
                        del last[v]
                        evicted[v] = idx
                        n += 1
                    for x in held:
                        push(heap, x)
                    evictions[k] = over
                misses[k] = miss
            for e in exps:   # the accesses, in order
                t += 1
                c = count.get(e, 0) + 1
                count[e] = c
                last[e] = t
                push(heap, (c, t, e))
        pool.t = t
        return refetch
