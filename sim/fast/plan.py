"""Cache decisions of the fast kernels (:mod:`moesim.sim.fast.order`), the first of its two passes:
which of a block of steps' accesses hit, which miss, and how many residents each step evicts.

On a demand-only run every pool is a layer's and a layer's decisions depend only on that layer's
accesses, so LRU, FIFO, LFU and Belady decide one layer at a time over a block of iterations, in
a tight loop with the pool's state in locals. Random draws from one stream shared by the pools,
so it decides step by step in the event loop's order (iterations, then layers).

Each planner keeps one pool per layer: its residents, as the shipped rule orders them (LRU: least
recently used first; FIFO and Random: first in first; LFU: a heap of ``(count, last access,
expert)``; Belady: a heap of ``(-next use, expert)``). A step's accesses are applied after its
evictions, in access order, as ``on_access`` applies them after the demand loads were given room;
the step's own experts are pinned (never victims). :meth:`Planner.plan` writes, for the step of
block iteration ``s`` and layer ``l`` at ``k = s * L + l``, the list of missed experts
(``misses[k]``, access order; the caller fills the list with :data:`NO_MISS`) and the number of
evictions (``evictions[k]``, filled with 0), and returns how
many misses reload an expert evicted in this iteration or the one before (refetches).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

import numpy as np

from moesim.sim.fast.draws import Draws, exact_draws

NO_MISS: list[int] = []
"""The shared empty miss list of a step that hit every expert (never mutated)."""


class Planner(ABC):
    """Per-layer pools for one run of the fast kernel; subclasses decide the victims."""

    def __init__(self, num_layers: int, slots: list[int], warm: list[list[int]],
                 last_evict: dict[tuple[int, int, int], int]) -> None:
        self.L = num_layers
        self.slots = slots
        # per layer: expert -> iteration of its last eviction (refetch accounting)
        self.evicted: list[dict[int, int]] = [{} for _ in range(num_layers)]
        for (layer, e, _p), idx in last_evict.items():
            self.evicted[layer][e] = idx
        self.pools: list[Any] = [self.new_pool(layer, warm[layer]) for layer in range(num_layers)]

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """The pool of ``layer`` holding the warm-start ``experts`` (in placement order)."""
        return OrderedDict.fromkeys(experts)

    @abstractmethod
    def plan(self, seqs: list[list[list[int]]], idxs: list[int], misses: list[Any],
             evictions: list[int]) -> int:
        """Decide a block: ``seqs[l][s]`` are layer ``l``'s experts (access order) at block
        iteration ``s``, whose index is ``idxs[s]``. Returns the block's refetches."""

    def resident(self) -> int:
        """Experts resident in all pools now."""
        return sum(len(p) for p in self.pools)

    def finish(self, last_evict: dict[tuple[int, int, int], int]) -> None:
        """After the last block: record each evicted unit's iteration of last eviction in
        ``last_evict`` (the transfers' ``last_evict_iter``)."""
        last_evict.update({(layer, e, 0): idx for layer, ev in enumerate(self.evicted) for e, idx in ev.items()})


class LayerPlanner(Planner):
    """A planner whose pools decide one layer at a time over a block."""

    def plan(self, seqs: list[list[list[int]]], idxs: list[int], misses: list[Any],
             evictions: list[int]) -> int:
        """See :meth:`Planner.plan`."""
        refetch = 0
        for layer in range(self.L):
            refetch += self.plan_layer(layer, seqs[layer], idxs, misses, evictions)
        return refetch

    @abstractmethod
    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """Decide ``layer``'s steps of a block (see :meth:`Planner.plan`)."""


class LruPlanner(LayerPlanner):
    """LRU: the victim is the unpinned resident used longest ago."""

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`Planner.plan`. The step's experts go last in access order first (hits
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


class FifoPlanner(LayerPlanner):
    """FIFO: the victim is the unpinned resident that came in first; hits do not move.

    With ``fixed`` (``static``: each layer's static set, resident from the start), those experts
    always hit and never leave, and the rest of the pool is a FIFO cache of the slots left."""

    def __init__(self, num_layers: int, slots: list[int], warm: list[list[int]],
                 last_evict: dict[tuple[int, int, int], int], fixed: list[set[int]] | None = None) -> None:
        self.fixed = fixed if fixed is not None else [set() for _ in range(num_layers)]
        super().__init__(num_layers, [n - len(f) for n, f in zip(slots, self.fixed, strict=True)],
                         [[e for e in w if e not in f] for w, f in zip(warm, self.fixed, strict=True)],
                         last_evict)

    def resident(self) -> int:
        """Experts resident in all pools now (the fixed ones too)."""
        return super().resident() + sum(len(f) for f in self.fixed)

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`Planner.plan`. The step's misses come in (last) first; the victims are
        then the oldest entries that are not the step's hits."""
        pool = self.pools[layer]
        fixed = self.fixed[layer]
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
                if e not in pool and e not in fixed:
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
                gone = []
                for v in pool:
                    if v not in exps:
                        gone.append(v)
                        if len(gone) == over:
                            break
                for v in gone:
                    del pool[v]
                    evicted[v] = idx
                evictions[k] = over
            misses[k] = miss
        return refetch


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


class LfuPlanner(LayerPlanner):
    """LFU: the victim is the unpinned resident of fewest accesses since it came in, ties to
    the one whose count changed least recently."""

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """A heap-kept pool (warm-start experts count as accessed, in order)."""
        return _LfuPool(experts)

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`Planner.plan` (the pool's bookkeeping inlined: this loop is the kernel)."""
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


class RandomPlanner(Planner):
    """Random: a uniform victim among the unpinned residents in the order they came in, drawn
    from the rule's own stream; the pools draw in the event loop's order (step by step)."""

    def __init__(self, num_layers: int, slots: list[int], warm: list[list[int]],
                 last_evict: dict[tuple[int, int, int], int], rng: np.random.Generator) -> None:
        super().__init__(num_layers, slots, warm, last_evict)
        self.rng = rng
        self.draws = Draws(rng) if exact_draws(rng) else None

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """An insertion-ordered dict."""
        return dict.fromkeys(experts)

    def plan(self, seqs: list[list[list[int]]], idxs: list[int], misses: list[Any],
             evictions: list[int]) -> int:
        """See :meth:`Planner.plan`; decides iteration by iteration, layer by layer. A step's
        misses come in (last) before its victims are drawn among the others."""
        rng = self.rng
        draw = self.draws.draw if self.draws is not None else (lambda n: int(rng.integers(n)))
        pools, slots, evicted_all = self.pools, self.slots, self.evicted
        L = self.L
        refetch = 0
        k = -1
        for s, idx in enumerate(idxs):
            prev = idx - 1
            for layer in range(L):
                k += 1
                exps = seqs[layer][s]
                pool = pools[layer]
                miss = None
                for e in exps:
                    if e not in pool:
                        pool[e] = None
                        if miss is None:
                            miss = [e]
                            last_out = evicted_all[layer].get
                        else:
                            miss.append(e)
                        if last_out(e, -2) >= prev:   # evicted in the previous iteration
                            refetch += 1
                if miss is None:
                    continue
                over = len(pool) - slots[layer]
                if over > 0:
                    evicted = evicted_all[layer]
                    for _ in range(over):
                        cands = [v for v in pool if v not in exps]
                        v = cands[draw(len(cands))]
                        del pool[v]
                        evicted[v] = idx
                    evictions[k] = over
                misses[k] = miss
        return refetch

    def finish(self, last_evict: dict[tuple[int, int, int], int]) -> None:
        """See :meth:`Planner.finish`; also leaves the rule's generator as its own draws would."""
        super().finish(last_evict)
        if self.draws is not None:
            self.draws.close()


class BeladyPlanner(LayerPlanner):
    """Belady's MIN: the victim is the unpinned resident whose next use lies farthest ahead
    (never used again: the lowest expert id first), as ``BeladyCache`` picks it from the oracle
    annotation. Next uses are positions in the layer's whole access sequence (steps in order,
    each step's experts in access order), the order of the annotation's keys."""

    def __init__(self, num_layers: int, slots: list[int], warm: list[list[int]],
                 last_evict: dict[tuple[int, int, int], int], flat: list[np.ndarray]) -> None:
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
        self.pos = [0] * num_layers
        super().__init__(num_layers, slots, warm, last_evict)

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
        """See :meth:`Planner.plan`."""
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
