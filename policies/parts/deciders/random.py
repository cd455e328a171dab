"""The Random rule's decider: a uniform victim drawn from the rule's own stream."""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.parts.deciders.base import Decider, PoolStart
from moesim.policies.parts.deciders.draws import Draws, exact_draws


class RandomDecider(Decider):
    """Random: a uniform victim among the unpinned residents in the order they came in, drawn
    from the rule's own stream; the pools draw in the event loop's order (step by step)."""

    name = "random"

    def __init__(self, start: PoolStart, rng: np.random.Generator) -> None:
        super().__init__(start)
        self.rng = rng
        self.draws = Draws(rng) if exact_draws(rng) else None

    def new_pool(self, layer: int, experts: list[int]) -> Any:
        """An insertion-ordered dict."""
        return dict.fromkeys(experts)

    def plan(self, seqs: list[list[list[int]]], idxs: list[int], misses: list[Any],
             evictions: list[int]) -> int:
        """See :meth:`.Decider.plan`; decides iteration by iteration, layer by layer. A step's
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
        """See :meth:`.Decider.finish`; also leaves the rule's generator as its own draws would."""
        super().finish(last_evict)
        if self.draws is not None:
            self.draws.close()
