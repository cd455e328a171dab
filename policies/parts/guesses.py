"""The predictors' vectorised form: what a next-layer prefetcher guesses at each step, for the
next-layer prefetch kernel of the fast path (:mod:`moesim.sim.fast.prefetch`), as a cache
rule's decider (:mod:`moesim.policies.parts.deciders`) is its rule's: the ``(expert, score)``
pairs :meth:`~moesim.policies.parts.prefetchers.NextLayerPrefetcher.after_layer` would pass to
``prefetch_set``, computed a whole iteration at a time, exactly as the predictors compute them.
A predictor is replayed here under the ``kernel`` name it declares
(:mod:`moesim.policies.parts.kernel`); a change to one of them is a change here too.

* ``lookahead`` (:class:`~moesim.policies.parts.predictors.LookaheadPredictor`): each trace
  row's top-k of ``lookahead_logits`` in one stable argsort over the trace (one row's
  :func:`~moesim.policies.parts.predictors.top_experts` is a stable descending sort: ties to
  the lower expert, scores the logits' own floats); for top-1 and top-2 of finite logits, as
  many argmax passes (each the first of the largest left, as that sort orders them);
  iterations of several tokens call ``top_experts`` itself.
* ``previous-token`` (:class:`~moesim.policies.parts.predictors.PreviousTokenPredictor`): the
  previous iteration's routing of the target layer ranked ``top_k .. 1`` (after the last layer,
  this iteration's layer 0), then unrouted experts at 0 in id order; irregular rows (several
  tokens, repeated or dropped slots) build the predictor's score array and call ``top_experts``.
* ``oracle`` (:class:`~moesim.policies.parts.predictors.OraclePredictor`): the next step's
  recorded experts in access order, scored ``-rank``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.parts.predictors import top_experts

Guesses = tuple[list[list[int]], list[list[float]]]   # per layer: experts, and their scores


class GuessMaker:
    """The guesses of a run's prefetcher, an iteration at a time (see the module docstring).
    ``source`` is ``lookahead``, ``previous-token`` or ``oracle``; ``first_rows`` each
    iteration's trace rows of its first layer (one per token; a layer's are those ``+ layer``);
    ``k`` the experts per token."""

    def __init__(self, source: str, trace: Any, first_rows: list[np.ndarray], L: int, E: int, k: int) -> None:
        self.source, self.rows, self.L, self.E, self.k = source, first_rows, L, E, k
        self.experts = trace.experts
        self.la = trace.lookahead_logits
        if source == "lookahead" and k > 0:
            la = self.la
            # compared as float32 (float16, the trace's type, converts exactly: the same order and
            # ties, and numpy's float32 passes are vectorised, its float16 ones not: 18 -> 11 ms
            # for 128,000 rows of 8); the scores stay the logits' own floats
            la32 = la if la.dtype.char == "f" else la.astype(np.float32)
            scores = la if la.dtype.char in "ef" else la32
            if k <= 2 and bool(np.isfinite(la32).all()):   # k argmax passes: the first largest, as the sort puts it
                work = la32 if scores is not la32 else la32.copy()   # a float16 trace's own copy, spent
                rows = np.arange(len(work))
                cols = []
                for _ in range(min(k, work.shape[1])):
                    cols.append(work.argmax(axis=1))
                    work[rows, cols[-1]] = -np.inf
                self.top_idx = np.stack(cols, axis=1)
            else:
                self.top_idx = np.argsort(-la32, axis=1, kind="stable")[:, :k]
            self.top_val = np.take_along_axis(scores, self.top_idx, axis=1)

    def guesses(self, pos: int) -> Guesses:
        """Per layer ``l`` of iteration ``pos``: the guess made after ``l`` is routed."""
        if self.source == "lookahead":
            return self._lookahead(self.rows[pos])
        if self.source == "oracle":
            return self._oracle(pos)
        return self._previous(pos)

    def _lookahead(self, rows0: np.ndarray) -> Guesses:
        L = self.L
        if rows0.shape[0] == 1:
            r = int(rows0[0])
            return self.top_idx[r:r + L].tolist(), self.top_val[r:r + L].tolist()
        ti: list[list[int]] = []
        tv: list[list[float]] = []
        for layer in range(L):
            pairs = top_experts(self.la[rows0 + layer], self.k)
            ti.append([p[0] for p in pairs])
            tv.append([p[1] for p in pairs])
        return ti, tv

    def _oracle(self, pos: int) -> Guesses:
        rows0 = self.rows[pos]
        nxt = self.rows[pos + 1] if pos + 1 < len(self.rows) else None
        if rows0.shape[0] == 1:   # one token: this iteration's next rows as lists, at once
            r = int(rows0[0])
            rows = self.experts[r + 1:r + self.L].tolist()
            rows.append([] if nxt is None else self.experts[nxt].reshape(-1).tolist())
            orders = [list(dict.fromkeys(x)) for x in rows]
            return orders, [[float(-rank) for rank in range(len(x))] for x in orders]
        steps: list[Any] = [rows0 + layer for layer in range(1, self.L)]
        steps.append(nxt)
        ti: list[list[int]] = []
        tv: list[list[float]] = []
        for rows in steps:   # after the last iteration's last layer: no next step, no guess
            order = [] if rows is None else list(dict.fromkeys(self.experts[rows].reshape(-1).tolist()))
            ti.append(order)
            tv.append([float(-rank) for rank in range(len(order))])
        return ti, tv

    def _previous(self, pos: int) -> Guesses:
        L = self.L
        cur = self.rows[pos]
        prev = self.rows[pos - 1] if pos > 0 else None
        one = None   # the previous iteration's rows as lists, when it ran one token
        if prev is not None and prev.shape[0] == 1:
            r = int(prev[0])
            one = self.experts[r:r + L].tolist()
        ti: list[list[int]] = []
        tv: list[list[float]] = []
        for layer in range(L):
            src = cur if layer + 1 == L else prev   # after the last layer: this iteration's layer 0
            if src is None:
                ti.append([])
                tv.append([])
                continue
            rows = src + (layer + 1) % L
            if layer + 1 < L and one is not None:   # src is prev
                pairs = self._ranked(one[layer + 1])
            else:
                pairs = self._ranked(self.experts[rows[0]].tolist() if len(rows) == 1 else self.experts[rows])
            ti.append([p[0] for p in pairs])
            tv.append([p[1] for p in pairs])
        return ti, tv

    def _ranked(self, prev: Any) -> list[tuple[int, float]]:
        """:meth:`PreviousTokenPredictor.predict` on the routing ``prev``: one token's experts
        (a list), or ``[n, top_k]``."""
        E, k = self.E, self.k
        if isinstance(prev, list):
            K = len(prev)
            if min(prev) >= 0 and len(set(prev)) == K:   # distinct experts: the ranks, then zeros
                kk = min(k, E)
                out = [(e, float(K - j)) for j, e in enumerate(prev)][:kk]
                if kk > K:
                    seen = set(prev)
                    out.extend([(e, 0.0) for e in range(E) if e not in seen][:kk - K])
                return out
            prev = np.array([prev], dtype=self.experts.dtype)
        K = prev.shape[1]
        scores = np.zeros((prev.shape[0], E), dtype=np.float32)
        for t in range(prev.shape[0]):
            scores[t, prev[t]] = np.arange(K, 0, -1)
        return top_experts(scores, k)
