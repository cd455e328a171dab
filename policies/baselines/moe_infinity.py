"""MoE-Infinity as MoEpic's evaluation describes it (Xue et al., 2024; MoEpic sections 2.2,
4.1 and 5): an LFU expert cache and activation-aware prefetching from request-level expert
activation matrices.

This is our reading of its mechanism as MoEpic describes it, not of MoE-Infinity's own paper:

* Each request in flight keeps an Expert Activation Matrix (EAM), ``[L, E]`` counts of the
  tokens of that request routed to each expert so far.
* Finished requests' EAMs go into a collection (EAMC) of ``eamc_capacity`` matrices, oldest
  out first. A request is finished when its batch is done.
* After layer ``l`` is routed, each request of the iteration finds the EAM of the collection
  most similar to its own (cosine similarity over all layers) and reads off the activation
  distribution of layers ``l + 1 .. l + prefetch_distance``; with an empty collection, or no
  stored matrix sharing an expert with it, the request's own EAM stands in. The ``prefetch_experts`` most likely experts of each of those
  layers are prefetched, priority = probability / layer distance, into the layer's cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from moesim.policies.contract.base import Context, Outcome, View
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LFUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.prefetchers import Prefetcher


@register
class MoEInfinity(Composed):
    """LFU cache plus request-level activation-matrix prefetch (see the module docstring)."""

    name = "moe-infinity"
    summary = "MoE-Infinity: LFU + activation-matrix (EAM) matching prefetch"
    paper = "Xue et al., MoE-Infinity (2024), as MoEpic's evaluation describes it"
    setup_needs = SetupNeeds(profile_share=DEFAULT_PROFILE_SHARE,
                             source="MoE-Infinity: the activation-matrix collection is built before serving")

    def __init__(self, *, eamc_capacity: int = 64, prefetch_experts: int | None = None,
                 prefetch_distance: int = 1) -> None:
        self.eamc_capacity = eamc_capacity
        self.prefetch_experts = prefetch_experts
        self.prefetch_distance = prefetch_distance
        self.assemble(cache=LFUCache(), prefetcher=EAMPrefetcher(eamc_capacity, prefetch_experts, prefetch_distance))


class EAMPrefetcher(Prefetcher):
    """Prefetch from the stored expert activation matrix most similar to each request's own."""

    def __init__(self, eamc_capacity: int, prefetch_experts: int | None, prefetch_distance: int) -> None:
        if eamc_capacity < 1:
            raise ValueError(f"eamc_capacity must be >= 1, got {eamc_capacity}")
        if prefetch_experts is not None and prefetch_experts < 0:
            raise ValueError("prefetch_experts must be >= 0")
        if prefetch_distance < 1:
            raise ValueError(f"prefetch_distance must be >= 1, got {prefetch_distance}")
        self.eamc_capacity = eamc_capacity
        self.prefetch_experts = prefetch_experts
        self.prefetch_distance = prefetch_distance

    def setup(self, ctx: Context) -> None:
        """Empty matrices; the collection starts from the profile split when one is given
        (MoE-Infinity prepares its collection before serving)."""
        self._L, self._E = ctx.num_layers, ctx.num_experts
        self._k = ctx.top_k if self.prefetch_experts is None else self.prefetch_experts
        self._eams: dict[int, np.ndarray] = {}
        self._counts: dict[int, list[int]] = {}    # the same counts as Python ints, flattened
        self._sq: dict[int, int] = {}              # sum of squared counts (exact: counts are integers)
        self._eamc = np.zeros((0, self._L * self._E))         # rows: unit-norm flattened EAMs
        self._eamc_raw = np.zeros((0, self._L, self._E))
        self._stored: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
        self._batch = -1
        if ctx.profile is not None:
            prof = ctx.profile
            for r in dict.fromkeys(prof.request_id.tolist()):
                sel = prof.experts[prof.request_id == r]          # [tokens, L, k]
                eam = np.zeros((self._L, self._E))
                for layer in range(self._L):
                    np.add.at(eam[layer], sel[:, layer, :].reshape(-1), 1.0)
                self._eams[int(r)] = eam
            self._archive()

    def _archive(self) -> None:
        done = [m for m in self._eams.values() if m.sum() > 0]
        self._eams = {}
        self._counts = {}
        self._sq = {}
        if not done:
            return
        raw = np.concatenate([self._eamc_raw, np.stack(done)])[-self.eamc_capacity:]
        flat = raw.reshape(raw.shape[0], -1)
        self._eamc_raw = raw
        self._eamc = flat / np.linalg.norm(flat, axis=1, keepdims=True)
        self._stored = {}

    def on_iteration_start(self, view: View) -> None:
        """A new batch archives the finished requests' matrices."""
        batch = view.iteration.batch
        if batch != self._batch:
            self._archive()
            self._batch = batch

    def _new_request(self, r: int) -> np.ndarray:
        eam = self._eams[r] = np.zeros((self._L, self._E))
        self._counts[r] = [0] * (self._L * self._E)
        self._sq[r] = 0
        return eam

    @staticmethod
    def _normalised(row: Sequence[float]) -> list[float]:
        """A row of counts divided by its total (all zeros when the total is 0); the counts are
        integers, so their sum is exact in any order, and each quotient is the correctly rounded
        one, as numpy's float64 division gives."""
        tot = sum(row)
        if tot > 0:
            return [c / tot for c in row]
        return [0.0] * len(row)

    @staticmethod
    def _order(p: list[float]) -> list[int]:
        """Indices by decreasing value, ties by index (a stable argsort of ``-p``)."""
        return sorted(range(len(p)), key=lambda e: -p[e])

    def _best_stored(self, r: int) -> int:
        """Row of the collection most similar to request ``r``'s matrix; -1: the request's own."""
        if self._eamc.shape[0]:
            sq = self._sq[r]
            if sq > 0:
                norm = math.sqrt(sq)   # == np.linalg.norm: the sum of squares is an exact integer
                sim = self._eamc @ (self._eams[r].reshape(-1) / norm)
                best = int(sim.argmax())
                if sim[best] > 0:   # no stored request shares an expert: keep the request's own
                    return best
        return -1

    def _stored_row(self, best: int, target: int) -> tuple[list[float], list[int]]:
        """Stored matrix ``best``'s distribution of layer ``target`` and its order (cached until the
        collection changes)."""
        key = (best, target)
        got = self._stored.get(key)
        if got is None:
            p = self._normalised(self._eamc_raw[best, target].tolist())
            got = self._stored[key] = (p, self._order(p))
        return got

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Update each request's matrix; prefetch the likeliest experts of the next layers."""
        reqs = view.iteration.request_ids.tolist()
        E = self._E
        base = layer * E
        eams, counts, sqs = self._eams, self._counts, self._sq
        for t, row in enumerate(outcome.plan.tolist()):
            r = reqs[t]
            eam = eams.get(r)
            if eam is None:
                eam = self._new_request(r)
            cnt = counts[r]
            sq = sqs[r]
            for e in set(row):   # a repeated expert counts once (as a buffered fancy-index add)
                if e >= 0:
                    c = cnt[base + e]
                    cnt[base + e] = c + 1
                    sq += 2 * c + 1
                    eam[layer, e] = c + 1.0
            sqs[r] = sq
        layers = range(layer + 1, min(self._L, layer + 1 + self.prefetch_distance))
        if not layers or self._k == 0:
            return
        uniq = list(dict.fromkeys(reqs))
        bests = [self._best_stored(r) for r in uniq]
        k = self._k
        cache = self.cache
        prefetch = view.prefetch
        refresh = cache.refresh if cache is not None else None
        for target in layers:
            prob: list[float] | None = None
            order: list[int] | None = None
            for r, best in zip(uniq, bests, strict=True):
                if best >= 0:
                    p, o = self._stored_row(best, target)
                else:
                    p = self._normalised(counts[r][target * E:(target + 1) * E])
                    o = None
                if prob is None:
                    prob, order = p, o
                else:   # np.maximum, element by element (no NaN here)
                    prob = [b if b > a else a for a, b in zip(prob, p, strict=True)]
                    order = None
            assert prob is not None
            if order is None:
                order = self._order(prob)
            dist = target - layer
            for e in order[:k]:
                pe = prob[e]
                if pe <= 0:
                    break
                if prefetch(target, e, 0, pe / dist) and refresh is not None:
                    refresh((target, e, 0))
