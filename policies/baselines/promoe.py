"""``promoe-style``: an approximation of ProMoE (Song et al., 2024) as fMoE's evaluation rebuilds
it (stride-based speculative prefetch with per-layer learned predictors). The trace holds no
hidden states to train ProMoE's predictors on, so, approximately: after layer ``l`` is routed,
layer ``l + 1`` is guessed by the next router applied to ``l``'s hidden state
(``lookahead_logits``, its top-k), and layers ``l + 2 .. l + stride`` by a learned transition
table ``[l, s]: expert at l -> expert at l + s`` (co-routing counts of the profiling split,
updated with every routed token), its top-k for the token's experts at ``l``; priority
``score / distance``, into an LRU cache. The spec sheet's reading (``fmoe.md`` section 5:
the previous token's routing for ``l + 2..``) is not used: with an LRU cache those experts are
almost always still resident, so it would prefetch nothing. Labelled approximate in outputs.
"""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import Context, Outcome, View
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import softmax_rows, top_experts
from moesim.policies.parts.prefetchers import Prefetcher


class StridePrefetcher(Prefetcher):
    """Lookahead for ``l + 1``, learned co-routing transitions for ``l + 2 .. l + stride``."""

    def __init__(self, stride: int) -> None:
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.stride = stride

    def required_columns(self) -> frozenset[str]:
        """Needs ``lookahead_logits``."""
        return frozenset({"lookahead_logits"})

    def setup(self, ctx: Context) -> None:
        """The guess width (the model's top-k) and the transition tables, from the profile."""
        self._k = ctx.top_k
        L, E = ctx.num_layers, ctx.num_experts
        self._trans = np.zeros((L, max(1, self.stride + 1), E, E))
        if ctx.profile is not None:
            for row in ctx.profile.experts:
                self._learn(np.asarray(row))

    def _learn(self, routed: np.ndarray) -> None:
        """Count co-routing of one token ``[L, k]`` at distances 2..stride."""
        L = routed.shape[0]
        if routed.min(initial=0) >= 0:
            # every layer pair of a distance at once; a repeated (a, b) within one layer pair
            # counts once, as the += of np.ix_ below does (a buffered fancy-index add)
            for s in range(2, min(self.stride, L - 1) + 1):
                lays = np.arange(L - s)[:, None, None]
                self._trans[lays, s, routed[:L - s, :, None], routed[s:, None, :]] += 1.0
            return
        for s in range(2, self.stride + 1):
            for lay in range(L - s):
                a, b = routed[lay], routed[lay + s]
                a, b = a[a >= 0], b[b >= 0]
                self._trans[lay, s][np.ix_(a, b)] += 1.0

    def on_iteration_end(self, view: View) -> None:
        """Learn from the tokens just routed."""
        if self.stride < 2:
            return
        L = view.num_layers
        plans = [view.routing(lay).experts for lay in range(L)]
        for t in range(plans[0].shape[0]):
            self._learn(np.stack([p[t] for p in plans]))

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Prefetch the guesses, nearer layers first."""
        L = view.num_layers
        look = view.lookahead_logits(layer)
        if layer + 1 < L and look is not None:
            guess = top_experts(softmax_rows(look), self._k)
            self.prefetch_set(view, layer + 1, [(e, float(p)) for e, p in guess])
        cur = outcome.routing.experts
        for t in range(layer + 2, min(L, layer + 1 + self.stride)):
            dist = t - layer
            if cur.shape[0] == 1:   # one token: the same sums and top-k, without the 2-D steps
                row = cur[0]
                sc = self._trans[layer, dist][row[row >= 0]].sum(axis=0)
                tot1 = sc.sum()
                if not tot1:
                    continue
                prob1 = (sc / tot1)[None, :]
                guess = [(e, p) for e, p in top_experts(prob1, self._k) if p > 0]
                self.prefetch_set(view, t, [(e, float(p) / dist) for e, p in guess])
                continue
            scores = np.stack([self._trans[layer, dist][row[row >= 0]].sum(axis=0) for row in cur])
            tot = scores.sum(axis=1, keepdims=True)
            if not tot.any():
                continue
            prob = np.divide(scores, tot, out=np.zeros_like(scores), where=tot > 0)
            guess = [(e, p) for e, p in top_experts(prob, self._k) if p > 0]
            self.prefetch_set(view, t, [(e, float(p) / dist) for e, p in guess])


@register
class ProMoEStyle(Composed):
    """LRU plus stride prefetch (see the module docstring); approximate."""

    name = "promoe-style"
    summary = "approximate ProMoE: LRU + lookahead prefetch of l+1, learned co-routing strides for l+2..l+stride"
    paper = "Song et al., ProMoE (2024), as fMoE's evaluation rebuilds it (approximate)"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}), profile_share=DEFAULT_PROFILE_SHARE,
                             source="ProMoE: predictors learnt offline; l+1 from the next gate's lookahead")

    def __init__(self, *, stride: int = 3) -> None:
        self.stride = stride
        self.assemble(cache=LRUCache(), prefetcher=StridePrefetcher(stride))
