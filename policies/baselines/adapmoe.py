"""AdapMoE as MoEpic's evaluation describes it (Zhong et al., ICCAD 2024; MoEpic section 4.1):
Mixtral-offloading's LRU cache and speculative next-layer prefetch, plus per-layer cache
sizes chosen by dynamic programming.

This is our reading of the mechanism as MoEpic describes it, not of AdapMoE's own paper. The dynamic programme
minimises the expected number of expert loads per token that neither the cache nor the
prefetch covers,

    min_{c_1..c_L} sum_i K * (1 - H_i(c_i)) * (1 - a_i)      s.t.  sum_i c_i <= B,  1 <= c_i <= N

with ``H_i(c)`` the LRU hit rate of layer ``i`` at ``c`` cached experts (from LRU stack
distances, exact for every ``c`` in one pass) and ``a_i`` the share of layer ``i``'s
activations that its speculative prefetch guessed, both measured online. It re-runs every
``realloc_tokens`` tokens and the new sizes apply at the next idle point.
"""

from __future__ import annotations

import numpy as np

from moesim.policies.baselines.speculative import MixtralOffloading
from moesim.policies.contract.base import RESIDENT, Context, Outcome, PolicySetupError, View
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.prefetchers import NextLayerPrefetcher


def allocate_cache_sizes(costs: np.ndarray, budget: int, *, minimum: int = 1) -> np.ndarray:
    """Dynamic programme: ``costs[i, c]`` is layer ``i``'s cost with ``c`` cached experts
    (``c = 0..N``); returns the sizes ``c_i >= minimum`` with ``sum c_i <= budget`` minimising
    the total cost (ties: the smaller sizes at the earlier layers). ``budget`` in experts."""
    L, width = costs.shape
    N = width - 1
    budget = max(budget, L * minimum)
    inf = np.inf
    best = np.zeros(budget + 1)                         # best[b]: min cost of layers < i using <= b
    choice = np.zeros((L, budget + 1), dtype=np.int64)
    for i in range(L):
        nxt = np.full(budget + 1, inf)
        arg = np.zeros(budget + 1, dtype=np.int64)
        for c in range(minimum, min(N, budget) + 1):
            cand = np.full(budget + 1, inf)
            cand[c:] = best[: budget + 1 - c] + costs[i, c]
            better = cand < nxt - 1e-15
            nxt[better] = cand[better]
            arg[better] = c
        best, choice[i] = nxt, arg
    sizes = np.zeros(L, dtype=np.int64)
    b = int(np.argmin(best))
    for i in range(L - 1, -1, -1):
        sizes[i] = choice[i, b]
        b -= int(sizes[i])
    return sizes


@register
class AdapMoE(MixtralOffloading):
    """LRU + speculative prefetch (as ``mixtral-offloading``, with the cross-token prediction
    of layer 0 that AdapMoE introduced) + per-layer cache sizes by dynamic programming,
    re-planned every ``realloc_tokens`` tokens from online LRU hit curves and prefetch
    accuracies."""

    name = "adapmoe"
    summary = "AdapMoE: LRU + speculative prefetch + per-layer cache sizes by dynamic programming"
    paper = "Zhong et al., AdapMoE (ICCAD 2024), as MoEpic's evaluation describes it"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}), min_tokens_param="realloc_tokens",
                             source="MoEpic section 4.1: Mixtral-offloading's gate lookahead, sizes re-planned "
                                    "every realloc_tokens tokens")

    def __init__(self, *, prefetch_experts: int | None = None, predictor: str = "auto",
                 cross_token: bool = True, realloc_tokens: int = 512) -> None:
        super().__init__(prefetch_experts=prefetch_experts, predictor=predictor, cross_token=cross_token)
        if realloc_tokens < 1:
            raise ValueError(f"realloc_tokens must be >= 1, got {realloc_tokens}")
        self.realloc_tokens = realloc_tokens
        self.sizes: list[np.ndarray] = []      # every allocation installed, in order

    def setup(self, ctx: Context) -> None:
        """Set up the parts and empty statistics."""
        if len(ctx.pool_capacity) != ctx.num_layers:
            raise PolicySetupError(f"{self.name} sizes the cache of each layer: it needs one pool per "
                                   "layer (cache.scope: layer)")
        super().setup(ctx)
        L, E = ctx.num_layers, ctx.num_experts
        self._E = E
        self._k = ctx.top_k if self.prefetch_experts is None else self.prefetch_experts
        self._L, self._K = L, ctx.top_k
        self._eb = ctx.expert_bytes
        self._budget_experts = ctx.total_budget // ctx.expert_bytes
        self._stack: list[list[int]] = [[] for _ in range(L)]
        # counters as Python ints (per-access updates; numpy arrays only in cache_sizes)
        self._dist = [[0] * (E + 1) for _ in range(L)]      # LRU stack distances (E = cold)
        self._guessed = [0] * L
        self._activated = [0] * L
        self._guess_for: dict[int, tuple[int, set[int]]] = {}
        self._tokens = 0
        self._next = self.realloc_tokens
        self.sizes = []
        # the prefetcher is this class's only after_layer part and a plain next-layer prefetcher:
        # after_layer hands it the guess it just made (a predictor answers the same twice)
        pref = self.prefetcher
        self._reuse_guess = (isinstance(pref, NextLayerPrefetcher)
                             and type(pref).after_layer is NextLayerPrefetcher.after_layer
                             and self._by_hook["after_layer"] == [pref.after_layer])
        # ... and its prefetch_guess is prefetch_set for the target computed in after_layer
        self._direct_set = False
        if self._reuse_guess and isinstance(pref, NextLayerPrefetcher):
            self._direct_set = (type(pref).prefetch_guess is NextLayerPrefetcher.prefetch_guess
                                and type(pref).target is NextLayerPrefetcher.target)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Record stack distances and prefetch hits, then prefetch (the parts)."""
        it = view.iteration_index
        stack = self._stack[layer]
        E = self._E
        guess = self._guess_for.get(layer)
        hit_guess = guess[1] if guess is not None and guess[0] == it else set()
        dist = self._dist[layer]
        guessed = 0
        experts = outcome.experts
        for e in experts:
            if e in stack:
                d = stack.index(e)
                del stack[d]
            else:
                d = E
            stack.insert(0, e)
            dist[d] += 1
            if e in hit_guess:
                guessed += 1
        self._activated[layer] += len(experts)
        self._guessed[layer] += guessed
        pref = self.prefetcher
        assert isinstance(pref, NextLayerPrefetcher)
        L = view.num_layers
        if self._k:
            target, t_it = (layer + 1, it) if layer + 1 < L else (0, it + 1)
            predicted = pref.predictor.predict(view, layer, self._k)
            guess_set = set()   # a plain loop: a comprehension is a call of its own
            for e, _ in predicted:
                guess_set.add(e)
            self._guess_for[target] = (t_it, guess_set)
            if self._direct_set:   # pref.prefetch_guess(view, layer, predicted), inlined
                if layer + 1 < L or pref.cross_token:
                    pref.prefetch_set(view, target, predicted)
            elif self._reuse_guess:
                pref.prefetch_guess(view, layer, predicted)
            else:
                super().after_layer(view, layer, outcome)
        else:
            super().after_layer(view, layer, outcome)
        if layer == L - 1:
            self._tokens += outcome.plan.shape[0]

    def cache_sizes(self) -> np.ndarray:
        """The dynamic programme on the statistics so far (experts per layer)."""
        L, E, K = self._L, self._E, self._K
        dist = np.array(self._dist, dtype=np.int64)
        acts = np.maximum(1, dist.sum(axis=1))
        hit = np.concatenate([np.zeros((L, 1)), np.cumsum(dist[:, :E], axis=1) / acts[:, None]], axis=1)
        acc = np.array(self._guessed, dtype=np.int64) / np.maximum(1, np.array(self._activated, dtype=np.int64))
        costs = K * (1.0 - hit) * (1.0 - acc)[:, None]
        return allocate_cache_sizes(costs, int(self._budget_experts), minimum=1)

    def on_iteration_end(self, view: View) -> None:
        """Every ``realloc_tokens`` tokens, at an idle point, install the programme's sizes."""
        super().on_iteration_end(view)
        L = self._L
        if self._tokens < self._next or self._budget_experts < L:
            return
        view.cancel_prefetches()
        if any(view.state(*k) != RESIDENT for layer in range(L) for k in view.units_of_layer(layer)):
            return   # a transfer is in flight: not idle yet
        sizes = self.cache_sizes()
        caps = [int(c) * self._eb for c in sizes]
        for layer in range(L):
            pool = view.pool_of(layer)
            while view.used(pool) - view.draining(pool) > caps[layer]:   # draining room leaves as it lands
                cands = [k for k in view.resident_units(pool) if not view.in_buffer(*k)]
                cache = self.cache
                assert isinstance(cache, LRUCache)
                if not cands or not view.evict(*min(cands, key=cache.last_used)):
                    break
        view.set_layer_budgets(caps)
        self.sizes.append(sizes)
        while self._next <= self._tokens:
            self._next += self.realloc_tokens

    def final_warnings(self) -> list[str]:
        """Say so when the cache sizes were never re-planned (a run shorter than ``realloc_tokens``)."""
        if not self.sizes and self._tokens < self.realloc_tokens:
            return [f"adapmoe: realloc_tokens = {self.realloc_tokens}, but the run routed only {self._tokens} "
                    "tokens: the per-layer cache sizes were never re-planned (it ran as mixtral-offloading); "
                    "lower policy.params.realloc_tokens or replay more tokens"]
        return []
