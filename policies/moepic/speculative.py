"""MoEpic's speculative prefetch (section 3.2 of Yan, Liu, Xu, Huang: "Accelerating Mixture-of-Expert
Inference with Adaptive Expert Split Mechanism"): the ``K`` experts of the next layer ranked by
predicted score (Eq. 3) and issued one by one into the transfer buffer, each as the segments it
lacks. A mixin of :class:`~moesim.policies.moepic.policy.MoEpic`, which owns the state it reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.contract.base import ABSENT, ReadView, UnitKey, View
from moesim.policies.moepic.prediction import RowScores, lookahead_guess
from moesim.policies.parts.lcp_priority import CachePriority


class SpeculativePrefetch:
    """The guess of a layer (:meth:`_predict`) and its issue into the transfer buffer
    (:meth:`_fill`). The attributes below are set by the policy's ``setup``."""

    speculative: bool
    _E: int
    _K: int
    _rng: np.random.Generator
    _has_lookahead: bool
    _prio: CachePriority
    _routed: tuple[int, int]
    _spec: dict[UnitKey, int]
    # layer -> [iteration, experts in predicted order, their scores, next position]
    _queue: dict[int, list[Any]]
    _pred: dict[int, tuple[int, list[list[int]]]]
    _fractions: list[tuple[float, ...]]
    _no_buffer: bool                       # no transfer buffer (cache.buffer_experts 0)
    _sizes: list[tuple[int, ...] | None]   # part bytes per layer, None until read

    def _part_sizes(self, view: ReadView, layer: int) -> tuple[int, ...]:
        """Bytes of each part of an expert of ``layer``, read from the view once per split
        (the policy forgets them when it changes the split)."""
        sizes = self._sizes[layer]
        if sizes is None:
            sizes = tuple(view.part_bytes(layer, p) for p in range(len(self._fractions[layer])))
            self._sizes[layer] = sizes
        return sizes

    def _predict(self, view: View, target: int, target_iter: int, logits: np.ndarray | None,
                 probs: np.ndarray | None = None) -> None:
        """Rank the experts of layer ``target`` (of iteration ``target_iter``) by predicted
        score (Eq. 3): softmax of the lookahead router, the best over the iteration's tokens.
        ``probs``: that softmax of one-token ``logits`` as the view made it, or None."""
        E = self._E
        K = self._K   # the predicted activated experts (section 3.2), no further
        order: list[int]
        scores: list[float] | RowScores   # a one-token guess's scores: computed when first issued
        per_token: list[list[int]]
        if not self.speculative:           # w/o SP: random order
            order = self._rng.permutation(E).tolist()
            scores = [1.0 - y / E for y in range(min(K, E))]
            per_token = [order]
        elif logits is not None:
            ranked_guess = lookahead_guess(logits, K, probs)
            if ranked_guess is None:
                return
            order, scores, per_token = ranked_guess
        elif not self._has_lookahead:      # no lookahead in the trace: guess from history
            order = self._prio.ranking_list(target)
            scores = [1.0 - y / E for y in range(min(K, E))]
            per_token = [order]
        else:                              # the first token has nothing to predict from
            return
        self._queue[target] = [target_iter, order[:K], scores, 0]
        self._pred[target] = (target_iter, per_token)

    def _fill(self, view: View, layer: int) -> None:
        """Issue the guesses for ``layer`` (its ``K`` predicted experts) in order while the
        transfer buffer has room for the next one: its bottom if the top is cached, else the
        whole expert; one that does not fit yet is retried at the next hook. The segments an
        expert lacks are read before any of them is issued."""
        entry = self._queue.get(layer)
        if entry is None:
            return
        if self._no_buffer and min(self._sizes[layer] or self._part_sizes(view, layer)) > 0:
            return   # no buffer: nothing can ever be issued (a stale entry only waits to be replaced)
        target_iter, order, scores, pos = entry
        it = view.iteration_index
        if target_iter < it or (target_iter == it and self._routed == (it, layer)):
            del self._queue[layer]
            return
        n = len(order)
        if pos >= n:   # every guess issued
            return
        sizes = self._sizes[layer] or self._part_sizes(view, layer)
        free = view.buffer_free()
        state, prefetch, spec = view.state, view.prefetch, self._spec
        # the scores as a list, read when the first guess of this call issues (a one-token
        # guess's RowScores computes them once, when first asked for)
        sc: list[float] | None = None
        if len(sizes) == 1:   # whole experts
            size = sizes[0]
            while pos < n:
                e = order[pos]
                if state(layer, e, 0) == ABSENT:
                    if size > free:
                        break
                    if sc is None:
                        sc = scores if scores.__class__ is list else scores.get()
                    if not prefetch(layer, e, 0, priority=sc[pos], into_buffer=True):
                        break
                    spec[(layer, e, 0)] = target_iter
                    free -= size
                pos += 1
        else:                 # top (part 0) and bottom (part 1)
            s0, s1 = sizes
            while pos < n:
                e = order[pos]
                a0 = state(layer, e, 0) == ABSENT
                a1 = state(layer, e, 1) == ABSENT
                if a0 or a1:
                    need = (s0 if a0 else 0) + (s1 if a1 else 0)
                    if need > free:
                        break
                    if sc is None:
                        sc = scores if scores.__class__ is list else scores.get()
                    if a0:
                        if not prefetch(layer, e, 0, priority=sc[pos], into_buffer=True):
                            break
                        spec[(layer, e, 0)] = target_iter
                    if a1:
                        if not prefetch(layer, e, 1, priority=sc[pos], into_buffer=True):
                            break
                        spec[(layer, e, 1)] = target_iter
                    free -= need
                pos += 1
        entry[3] = pos
