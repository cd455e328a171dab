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

from array import array
from itertools import repeat
from operator import add, truediv

import numpy as np

from moesim.policies.contract.base import Context, Outcome, View
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import top_experts
from moesim.policies.parts.prefetchers import Prefetcher

# below this total of whole counts, float32 shares of distinct counts are distinct (see after_layer)
_EXACT_ORDER = float(2 ** 23)


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
        self._E = E
        # [l][s][a][b]: tokens that routed a at layer l and b at layer l + s, as float counts
        # (every count is a whole number, so sums of them are exact in any order); Python lists,
        # as a layer's handful of experts make numpy's per-call cost exceed the work
        self._trans: list[list[list[list[float]] | None]] = [
            [[[0.0] * E for _ in range(E)] if 2 <= s <= self.stride else None for s in range(self.stride + 1)]
            for _ in range(L)]
        # the same tables by distance: [s][l] is _trans[l][s] (for s in 2..stride; none below 2)
        self._by_dist: list[list[list[list[float]]]] = [
            [t for lay in range(L) if (t := self._trans[lay][s]) is not None] for s in range(self.stride + 1)]
        self._L = L
        # after layer l, the layers guessed from the tables: (t, t - l, _trans[l][t - l]) for
        # t in l + 2 .. l + stride within the model
        self._ahead: list[list[tuple[int, int, list[list[float]]]]] = [
            [(t, t - lay, tab) for t in range(lay + 2, min(L, lay + 1 + self.stride))
             if (tab := self._trans[lay][t - lay]) is not None] for lay in range(L)]
        self._top = min(self._k, E)
        # the current iteration's routed rows, per layer, as after_layer saw them (None: not yet)
        self._rows: list[list[list[int]] | None] = [None] * L
        if ctx.profile is not None:
            for row in ctx.profile.experts:
                self._learn(np.asarray(row).tolist())

    def _learn(self, routed: list[list[int]]) -> None:
        """Count co-routing of one token ``[L][k]`` at distances 2..stride; a pair (a, b) named
        twice within one layer pair counts once."""
        L = len(routed)
        sets: list[list[int]] = []   # each layer's distinct experts (-1 = none left out)
        for r in routed:
            if len(r) == 2:   # top-2, the common case: two distinct experts need no set
                a, b = r
                if a != b and a >= 0 and b >= 0:
                    sets.append(r)
                    continue
            sets.append([e for e in {e for e in r if e >= 0}])
        for s in range(2, min(self.stride, L - 1) + 1):
            # table [lay][s], the experts at lay and at lay + s, for lay in 0..L - s - 1
            for table, here, later in zip(self._by_dist[s], sets, sets[s:], strict=False):   # to the shortest
                if len(here) == 2 and len(later) == 2:   # the nested loops below, unrolled
                    b0, b1 = later
                    ta = table[here[0]]
                    ta[b0] += 1.0
                    ta[b1] += 1.0
                    ta = table[here[1]]
                    ta[b0] += 1.0
                    ta[b1] += 1.0
                    continue
                for a in here:
                    ta = table[a]
                    for b in later:
                        ta[b] += 1.0

    def on_iteration_end(self, view: View) -> None:
        """Learn from the tokens just routed (their rows as :meth:`after_layer` saw them, else
        as the view gives them)."""
        saved, self._rows = self._rows, [None] * self._L
        if self.stride < 2:
            return
        L = view.num_layers
        plans = saved if None not in saved else [view.routing(lay).experts.tolist() for lay in range(L)]
        for t in range(len(plans[0])):   # type: ignore[arg-type]
            self._learn([p[t] for p in plans])   # type: ignore[index]

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Prefetch the guesses, nearer layers first."""
        if layer + 1 < self._L:
            look = view.lookahead_probs(layer)   # softmax_rows(view.lookahead_logits(layer))
            if look is not None:
                self.prefetch_set(view, layer + 1, top_experts(look, self._k))
        rows = self._rows[layer] = outcome.routing.experts.tolist()   # kept for on_iteration_end's learning
        ahead = self._ahead[layer]
        if not ahead:
            return
        if len(rows) != 1:
            self._prefetch_tokens(view, rows, ahead)
            return
        routed = rows[0]
        if len(routed) != 2 or self._top != 2 or routed[0] < 0 or routed[1] < 0:
            self._prefetch_token(view, [a for a in routed if a >= 0], ahead)
            return
        # one token routed to two experts (a repeated one counts twice), top-2 guesses: the
        # common case, as _prefetch_token does it with the two rows summed in one pass
        a, b = routed
        prefetch_set = self.prefetch_set
        for t, dist, table in ahead:
            sc = list(map(add, table[a], table[b]))
            tot = sum(sc)   # whole numbers: exact in any order
            if not tot:
                continue
            if tot >= _EXACT_ORDER:
                prefetch_set(view, t, _float32_guess(sc, tot, dist, 2))
                continue
            # the two best counts (ties: the lower id, as the stable sort); the first is
            # positive (the total is), a second of 0 is no guess
            m0 = max(sc)
            e0 = sc.index(m0)
            sc[e0] = -1.0
            m1 = max(sc)
            p0, p1 = array("f", (m0 / tot, m1 / tot)).tolist()
            prefetch_set(view, t, [(e0, p0 / dist), (sc.index(m1), p1 / dist)] if p1 > 0 else [(e0, p0 / dist)])

    def _prefetch_token(self, view: View, src: list[int], ahead: list[tuple[int, int, list[list[float]]]]) -> None:
        """One token routed to ``src`` (its experts, a repeated one twice): each later layer's
        guess, the top-k of the token's summed rows, in Python."""
        E, top = self._E, self._top
        for t, dist, table in ahead:
            sc = [0.0] * E
            for a in src:
                sc = list(map(add, sc, table[a]))   # whole numbers: the same sums in any order
            tot = sum(sc)
            if not tot:
                continue
            if tot >= _EXACT_ORDER:
                self.prefetch_set(view, t, _float32_guess(sc, tot, dist, top))
                continue
            # top_experts reads the float64 shares as float32 ('f': the same C cast). Whole
            # counts in a total under 2**23: shares of distinct counts differ by more than two
            # float32 steps, so the float32 shares rank as the counts do (equal counts by
            # expert id), and only the best need converting
            best = sorted(range(E), key=sc.__getitem__, reverse=True)[:top]
            shares = array("f", [sc[e] / tot for e in best]).tolist()
            self.prefetch_set(view, t, [(e, p / dist) for e, p in zip(best, shares, strict=True) if p > 0])

    def _prefetch_tokens(self, view: View, rows: list[list[int]],
                         ahead: list[tuple[int, int, list[list[float]]]]) -> None:
        """Several tokens: each later layer's guess, the union of each token's top-k shares."""
        for t, dist, table in ahead:
            tab = np.array(table)
            scores = np.stack([tab[np.asarray([a for a in r if a >= 0], dtype=np.intp)].sum(axis=0) for r in rows])
            tot = scores.sum(axis=1, keepdims=True)
            if not tot.any():
                continue
            prob2 = np.divide(scores, tot, out=np.zeros_like(scores), where=tot > 0)
            guess = [(e, p) for e, p in top_experts(prob2, self._k) if p > 0]
            self.prefetch_set(view, t, [(e, float(p) / dist) for e, p in guess])


def _float32_guess(sc: list[float], tot: float, dist: int, top: int) -> list[tuple[int, float]]:
    """The ``top`` best of the counts ``sc`` by their float32 shares of ``tot`` (ties by
    expert id), each share over ``dist``; zero shares are no guess. For totals past
    :data:`_EXACT_ORDER`, where distinct counts can share a float32 share."""
    prob = array("f", map(truediv, sc, repeat(tot, len(sc)))).tolist()
    best = sorted(range(len(sc)), key=prob.__getitem__, reverse=True)[:top]
    return [(e, prob[e] / dist) for e in best if prob[e] > 0]


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
