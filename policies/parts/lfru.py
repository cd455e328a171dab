"""LFRU, the eviction rule of vLLM's expert cache proposal (vllm-project/vllm PR #37190,
``--moe-expert-cache-size``): one cache per MoE layer; evict the resident expert of least
``freq / (clock - last + 1)``.

The rule as the pull request's ``expert_weight_provider.py`` states it: each layer's cache has
its own integer ``clock``. A forward pass takes the layer's distinct routed experts in
ascending id order; a hit advances the clock, adds one to the expert's ``freq`` and sets its
``last`` to the clock; a miss takes a free slot if there is one, else evicts the resident entry
of least score (ties: the entry inserted earliest), then advances the clock and inserts the
expert with ``freq = 1, last = clock``. ``freq`` counts forward passes that used the expert
while resident and is forgotten on eviction; nothing decays; capacity is the only parameter.
As in the PR's later revision, an expert requested in the same pass is never the victim (the
engine pins it).

The engine asks for victims when a layer's demand loads need room, in access order and before
the accesses are recorded. So that the victims are vLLM's, the first request of a layer replays
the pass in vLLM's order (the clock each miss sees, free slots taken first) and hands the
victims out in that order.
"""

from __future__ import annotations

from collections.abc import Sequence

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    PolicySetupError,
    ReadView,
    Reason,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.parts.caches import CacheRule

_NONE = (0, 0, 0)   # the entry of an expert the cache does not hold


class LFRUCache(CacheRule):
    """Frequency over age, per layer (see the module docstring). Whole experts only."""

    def __init__(self) -> None:
        super().__init__()
        self._clock: dict[int, int] = {}
        self._entry: dict[UnitKey, list[int]] = {}   # key -> [freq, last, insertion number]
        self._inserted = 0
        self._plan_at: tuple[int, int] | None = None   # (iteration, layer) of the replayed pass
        self._victims: list[UnitKey] = []

    def demand_only(self) -> bool:
        """Loads only on demand."""
        return True

    def setup(self, ctx: Context) -> None:
        """Forget everything. vLLM's LFRU is one cache per MoE layer, each with its own clock: a
        single pool over all layers (``cache.scope: global``) has no such clock and is refused."""
        if len(ctx.pool_capacity) != ctx.num_layers:
            raise PolicySetupError("lfru keeps one cache per MoE layer (vLLM's LFRU, each layer with "
                                   "its own clock): it needs cache.scope: layer")
        self._clock = {}
        self._entry = {}
        self._inserted = 0
        self._plan_at = None
        self._victims = []

    def _insert(self, key: UnitKey) -> None:
        clock = self._clock[key[0]] = self._clock.get(key[0], 0) + 1
        self._inserted += 1
        self._entry[key] = [1, clock, self._inserted]

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """Warm-start units enter in placement order, as misses would."""
        for key in units:
            self._insert(key)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """The pass's distinct experts in ascending id order: a hit ages the clock and counts;
        a miss (now loading) is inserted with ``freq = 1``."""
        entry = self._entry
        for e in sorted(outcome.experts):
            key = (layer, e, 0)
            got = entry.get(key)
            if got is None:
                self._insert(key)
            else:
                clock = self._clock[layer] = self._clock.get(layer, 0) + 1
                got[0] += 1
                got[1] = clock

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """An evicted expert's counts are forgotten."""
        self._entry.pop(unit, None)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """Nothing is prefetched; a withdrawn unit leaves no entry."""
        self._entry.pop(unit, None)

    def score(self, key: UnitKey, clock: int) -> tuple[float, int]:
        """``(freq / (clock - last + 1), insertion number)``: the victim has the least."""
        freq, last, seq = self._entry.get(key, (0, 0, 0))
        return freq / (clock - last + 1), seq

    def _least(self, candidates: Sequence[UnitKey], clock: int) -> UnitKey:
        """The first candidate of least :meth:`score` at ``clock`` (``min`` by score; the body
        of :meth:`score` inlined, a plain loop rather than a key function per call)."""
        if type(self).score is not LFRUCache.score:
            return min(candidates, key=lambda k: self.score(k, clock))
        get = self._entry.get
        best = candidates[0]
        freq, last, best_seq = get(best, _NONE)
        best_s = freq / (clock - last + 1)
        for k in candidates:   # the first again: never less than itself
            freq, last, seq = get(k, _NONE)
            sc = freq / (clock - last + 1)
            if sc < best_s or (sc == best_s and seq < best_seq):   # (score, seq) < best's
                best, best_s, best_seq = k, sc, seq
        return best

    def _replay_pass(self, view: ReadView, layer: int, candidates: Sequence[UnitKey]) -> list[UnitKey]:
        """vLLM's victims for this layer's pass: ids ascending, free slots first, each miss
        evicting the least score at the clock it sees."""
        routed = view.routing(layer).experts
        ids = sorted({e for e in routed.reshape(-1).tolist() if e >= 0})
        pool = view.pool_of(layer)
        held = set(view.resident_units(pool))   # the layer's resident units (its pool's)
        free = view.capacity(pool) // max(1, view.part_bytes(layer)) - len(held)
        clock = self._clock.get(layer, 0)
        left = list(candidates)
        victims = []
        for e in ids:
            if (layer, e, 0) not in held:   # a miss: a free slot, else a victim
                if free > 0:
                    free -= 1
                elif left:
                    v = self._least(left, clock)
                    left.remove(v)
                    victims.append(v)
            clock += 1
        return victims

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The least score; for a layer's demand loads, in the order vLLM evicts."""
        layer = request.unit[0]
        if request.reason is Reason.DEMAND and layer == view.layer:
            at = (view.iteration_index, layer)
            if self._plan_at != at:
                self._plan_at = at
                self._victims = self._replay_pass(view, layer, candidates)
            while self._victims:
                v = self._victims.pop(0)
                if v in candidates:
                    return v
        return self._least(candidates, self._clock.get(layer, 0))
