"""fMoE's expert cache rule (fMoE paper, section 4.5): evict the expert of
highest ``1 / (p * freq)``, ``p`` its probability in the latest matched expert map and ``freq``
its cache visit frequency: LFU weighted by the map, deliberately not recency-based.

Readings where the paper is silent (spec sheet ``fmoe.md`` B6, [rec]): ``p`` comes from the
map prefetcher's latest match of each request (max over requests; uniform before any match or
when composed with another prefetcher, which makes the rule plain LFU); ``freq`` counts
accesses since the unit came in (as moesim's LFU) plus ``freq_smoothing`` (the literal rule
gives a just-prefetched expert, ``freq = 0``, infinite priority: it would be evicted first);
with ``protect_window`` the experts wanted for the next ``d`` layers are never victims, unless
a demand load finds nothing else to evict.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    ReadView,
    Reason,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.fmoe.map_prefetch import ExpertMapPrefetcher
from moesim.policies.parts.caches import CacheRule

Key = tuple[float, int, int, int, int]
"""A unit's victim key ``(priority, -layer, -expert, -part, freq)``: the highest is evicted."""


class MapPriorityCache(CacheRule):
    """Evict the highest ``1 / (p * (freq + freq_smoothing))`` (see the module docstring)."""

    def __init__(self, freq_smoothing: float = 1.0, protect_window: bool = True,
                 maps: ExpertMapPrefetcher | None = None) -> None:
        super().__init__()
        if freq_smoothing < 0:
            raise ValueError(f"freq_smoothing must be >= 0, got {freq_smoothing}")
        self.freq_smoothing = freq_smoothing
        self.protect_window = protect_window
        self.maps = maps
        self.freq: dict[UnitKey, int] = {}
        # each known unit's victim key (priority, -layer, -expert, -part, freq): every unit the
        # rule was told of (executed, issued, or a candidate) until it leaves; keyed again, all of
        # them, at the first eviction after the maps' ``p_map`` changed (``_stale``; ``_pm``: the
        # ``p_map`` seen last); ``_keys_p``: the p of the latest keys (``[L, J]``, None: uniform)
        self._keys: dict[UnitKey, Key] = {}
        self._keys_p: np.ndarray | None = None
        self._pm: object = None
        self._stale = False

    def setup(self, ctx: Context) -> None:
        """Forget all counts."""
        self.freq = {}
        self._keys = {}
        self._keys_p = None
        self._pm = None
        self._stale = False
        self._J = ctx.num_experts

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """One visit per executed expert (and its victim key again)."""
        maps = self.maps
        if maps is not None and maps.p_map is not self._pm:   # _sync, its test inlined (once per layer)
            self._sync()
        freq, keys = self.freq, self._keys
        if self._stale:   # the keys are made again before they are read: the count is enough
            for e in outcome.experts:
                key = (layer, e, 0)
                f = freq[key] = freq.get(key, 0) + 1
                keys[key] = (0.0, -layer, -e, 0, f)
            return
        key_of, pm = self._key, self._keys_p
        for e in outcome.experts:
            key = (layer, e, 0)
            freq[key] = freq.get(key, 0) + 1
            keys[key] = key_of(key, pm)

    def refresh(self, key: UnitKey) -> None:
        """A unit the prefetcher issued: its victim key now (its count does not change: fMoE
        counts executions only)."""
        self._sync()
        self._keys[key] = (0.0, -key[0], -key[1], -key[2], self.freq.get(key, 0)) if self._stale \
            else self._key(key, self._keys_p)

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """Counts are forgotten when the unit leaves."""
        self.freq.pop(unit, None)
        self._keys.pop(unit, None)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """A withdrawn prefetch leaves nothing behind."""
        self.freq.pop(unit, None)
        self._keys.pop(unit, None)

    def priority(self, key: UnitKey) -> float:
        """``1 / (p * (freq + freq_smoothing))`` (infinite for ``p * freq = 0``)."""
        p = self.maps.p_evict(key[0], key[1]) if self.maps is not None else 1.0 / self._J
        den = p * (self.freq.get(key, 0) + self.freq_smoothing)
        return 1.0 / den if den > 0 else float("inf")

    # -- victim keys ------------------------------------------------------------------------------
    # Each known unit's victim key ``(priority, -layer, -expert, -part, freq)`` (``priority``
    # inlined) is kept in ``_keys``: computed when the unit is executed or issued (from its new
    # count), and for every known unit again at the first eviction after the maps' p changed (a
    # key is a function of the current p and count, so every kept key is the one :meth:`_key`
    # gives now; a stale key's priority is a placeholder, its count is current). The keys of
    # distinct units differ before ``freq``, so the highest key is the same whatever the
    # candidates' order, and ``freq`` (carried for :meth:`_rekey`) never decides.
    def _sync(self) -> None:
        """Follow the maps' p: when their ``p_map`` was replaced (a new match: every p may have
        changed), every kept key is stale (its p is read when the keys are made again)."""
        maps = self.maps
        if maps is not None and maps.p_map is not self._pm:
            self._pm = maps.p_map
            self._stale = True

    def _key(self, k: UnitKey, p_map: np.ndarray | None) -> Key:
        """The victim key of unit ``k`` under ``p_map`` (``[L, J]``; uniform for None)."""
        p = p_map.item(k[0], k[1]) if p_map is not None else 1.0 / self._J
        f = self.freq.get(k, 0)
        den = p * (f + self.freq_smoothing)
        return (1.0 / den if den > 0 else float("inf"), -k[0], -k[1], -k[2], f)

    def _rekey(self) -> None:
        """Key every known unit again under the maps' current p (stale keys made current), each
        unit's p gathered from ``p_map`` at once (Python floats, as ``item`` gives them)."""
        assert self.maps is not None   # stale only with maps
        pm = self._keys_p = self.maps.p_map
        keys, j = self._keys, pm.shape[1]
        ps = pm.ravel().take([t * j + e for t, e, _ in keys]).tolist()
        smooth, inf = self.freq_smoothing, float("inf")
        # a key's unit members and count (``v[1:]``) stay; its priority is made from them
        self._keys = {k: (1.0 / den if (den := p * (v[4] + smooth)) > 0 else inf, v[1], v[2], v[3], v[4])
                      for (k, v), p in zip(keys.items(), ps, strict=True)}
        self._stale = False

    def _best(self, cands: Sequence[UnitKey]) -> UnitKey:
        """The candidate of highest key (the kept keys made current first, and the candidates
        not known yet keyed, as :meth:`_key` keys them)."""
        if self._stale:
            self._rekey()
        keys = self._keys
        try:
            return max(cands, key=keys.__getitem__)
        except KeyError:   # a candidate not known yet
            pm, key_of = self._keys_p, self._key
            for k in cands:
                if k not in keys:
                    keys[k] = key_of(k, pm)
            return max(cands, key=keys.__getitem__)

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """The candidate of highest eviction priority that is neither ``protected`` nor (with
        ``protect_window``) in the maps' window: :meth:`victim` after the base rule's filter,
        taken as the highest key of all candidates when that one is not excluded (it is then
        the highest of the rest too)."""
        cands = request.candidates
        if not cands:
            return request.decline
        maps = self.maps
        if maps is not None and maps.p_map is not self._pm:
            self._sync()
        if self._stale:
            self._rekey()
        try:   # _best, its common case inlined (this runs for every eviction)
            best = max(cands, key=self._keys.__getitem__)
        except KeyError:   # a candidate not known yet
            best = self._best(cands)
        if best not in self.protected and (maps is None or not self.protect_window
                                           or best not in maps.window()):
            return best
        return CacheRule.choose_victim(self, view, request)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate of highest eviction priority outside the protected window."""
        cands = list(candidates)
        if self.protect_window and self.maps is not None:
            window = self.maps.window()
            outside = [k for k in cands if k not in window]
            if outside or request.reason is not Reason.DEMAND:
                cands = outside
        if not cands:
            return request.decline
        self._sync()
        return self._best(cands)
