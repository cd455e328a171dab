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
        self._eamc = np.zeros((0, self._L * self._E))         # rows: unit-norm flattened EAMs
        self._eamc_raw = np.zeros((0, self._L, self._E))
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
        if not done:
            return
        raw = np.concatenate([self._eamc_raw, np.stack(done)])[-self.eamc_capacity:]
        flat = raw.reshape(raw.shape[0], -1)
        self._eamc_raw = raw
        self._eamc = flat / np.linalg.norm(flat, axis=1, keepdims=True)

    def on_iteration_start(self, view: View) -> None:
        """A new batch archives the finished requests' matrices."""
        batch = view.iteration.batch
        if batch != self._batch:
            self._archive()
            self._batch = batch

    def _distribution(self, eam: np.ndarray, layers: list[int]) -> np.ndarray:
        """Predicted activation probabilities ``[len(layers), E]`` for one request."""
        src = eam
        if self._eamc.shape[0]:
            norm = np.linalg.norm(eam)
            if norm > 0:
                sim = self._eamc @ (eam.reshape(-1) / norm)
                best = int(np.argmax(sim))
                if sim[best] > 0:   # no stored request shares an expert: keep the request's own
                    src = self._eamc_raw[best]
        rows = src[layers]
        tot = rows.sum(axis=1, keepdims=True)
        return np.divide(rows, tot, out=np.zeros_like(rows, dtype=np.float64), where=tot > 0)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Update each request's matrix; prefetch the likeliest experts of the next layers."""
        reqs = view.iteration.request_ids
        plan = outcome.plan
        for t in range(plan.shape[0]):
            r = int(reqs[t])
            eam = self._eams.get(r)
            if eam is None:
                eam = self._eams[r] = np.zeros((self._L, self._E))
            row = plan[t]
            eam[layer, row[row >= 0]] += 1.0
        layers = list(range(layer + 1, min(self._L, layer + 1 + self.prefetch_distance)))
        if not layers or self._k == 0:
            return
        prob = np.zeros((len(layers), self._E))
        for r in dict.fromkeys(int(x) for x in reqs):
            np.maximum(prob, self._distribution(self._eams[r], layers), out=prob)
        for j, target in enumerate(layers):
            p = prob[j]
            order = np.argsort(-p, kind="stable")[: self._k]
            for e in order:
                if p[e] <= 0:
                    break
                key = (target, int(e), 0)
                if view.prefetch(*key, priority=float(p[e]) / (target - layer)) and self.cache is not None:
                    self.cache.refresh(key)
