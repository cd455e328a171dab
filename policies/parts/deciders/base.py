"""What a decider is: the decisions of a cache rule over a block of steps of a demand-only run,
the first of the cache kernel's two passes (:mod:`moesim.sim.fast.order` times the steps).

On a demand-only run every pool is a layer's and a layer's decisions depend only on that layer's
accesses, so most rules decide one layer at a time over a block of iterations
(:class:`LayerDecider`), in a tight loop with the pool's state in locals.

A decider keeps one pool per layer, its residents ordered as its rule orders them. A step's
accesses are applied after its evictions, in access order, as ``on_access`` applies them after
the demand loads were given room; the step's own experts are pinned (never victims).
:meth:`Decider.plan` writes, for the step of block iteration ``s`` and layer ``l`` at
``k = s * L + l``, the list of missed experts (``misses[k]``, access order; the caller fills
the list with :data:`NO_MISS`) and the number of evictions (``evictions[k]``, filled with 0),
and returns how many misses reload an expert evicted in this iteration or the one before
(refetches).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

NO_MISS: list[int] = []
"""The shared empty miss list of a step that hit every expert (never mutated)."""


@dataclass(frozen=True)
class PoolStart:
    """Where a run's pools start, as the kernel hands it to a rule's decider."""

    slots: list[int]
    """Each layer's pool, in experts."""
    warm: list[list[int]]
    """Each layer's resident experts at the start, in placement order."""
    last_evict: dict[tuple[int, int, int], int]
    """Each unit evicted before the start: the iteration of its last eviction."""
    sequences: Callable[[], list[np.ndarray]]
    """Each layer's whole access sequence (the steps in order, each step's experts in access
    order), for a rule that reads the future (Belady); computed when called."""


class Decider(ABC):
    """Per-layer pools for one run of the cache kernel; subclasses decide the victims."""

    name: ClassVar[str]
    """The kernel's name for the rule (``engine_path``: ``fast (NAME kernel)``), and its
    declared ``kernel`` (:mod:`moesim.policies.parts.kernel`)."""

    def __init__(self, start: PoolStart) -> None:
        self.L = len(start.slots)
        self.slots = start.slots
        # per layer: expert -> iteration of its last eviction (refetch accounting)
        self.evicted: list[dict[int, int]] = [{} for _ in range(self.L)]
        for (layer, e, _p), idx in start.last_evict.items():
            self.evicted[layer][e] = idx
        self.pools: list[Any] = [self.new_pool(layer, start.warm[layer]) for layer in range(self.L)]

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


class LayerDecider(Decider):
    """A decider whose pools decide one layer at a time over a block."""

    def plan(self, seqs: list[list[list[int]]], idxs: list[int], misses: list[Any],
             evictions: list[int]) -> int:
        """See :meth:`Decider.plan`."""
        refetch = 0
        for layer in range(self.L):
            refetch += self.plan_layer(layer, seqs[layer], idxs, misses, evictions)
        return refetch

    @abstractmethod
    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        """Decide ``layer``'s steps of a block (see :meth:`Decider.plan`)."""
