"""The FIFO rule's decider, and ``static``'s (FIFO beside its static set)."""

from __future__ import annotations

from typing import Any

from moesim.policies.parts.deciders.base import LayerDecider, PoolStart


class FifoDecider(LayerDecider):
    """FIFO: the victim is the unpinned resident that came in first; hits do not move.

    With ``fixed`` (``static``: each layer's static set, resident from the start), those experts
    always hit and never leave, and the rest of the pool is a FIFO cache of the slots left."""

    name = "fifo"

    def __init__(self, start: PoolStart, fixed: list[set[int]] | None = None) -> None:
        self.fixed = fixed if fixed is not None else [set() for _ in start.slots]
        super().__init__(PoolStart([n - len(f) for n, f in zip(start.slots, self.fixed, strict=True)],
                                   [[e for e in w if e not in f] for w, f in zip(start.warm, self.fixed, strict=True)],
                                   start.last_evict, start.sequences))

    def resident(self) -> int:
        """Experts resident in all pools now (the fixed ones too)."""
        return super().resident() + sum(len(f) for f in self.fixed)

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """See :meth:`.Decider.plan`. The step's misses come in (last) first; the victims are
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


class StaticDecider(FifoDecider):
    """``static`` started with its static set resident (``fixed``: each layer's): FIFO over the
    staging room beside it."""

    name = "static"

    def __init__(self, start: PoolStart, fixed: list[set[int]]) -> None:
        super().__init__(start, fixed)
