"""MoEpic's speculative guess from the lookahead router (section 3.2, Eq. 3): the experts of the
next layer ranked by the softmax of the router applied to the current hidden state (the trace's
``lookahead_logits``), the best score over the iteration's tokens."""

from __future__ import annotations

import math

import numpy as np

from moesim.policies.parts.predictors import softmax_rows


class RowScores:
    """The predicted scores of the first ``k`` experts of a one-token ranking, computed when first
    asked for (:meth:`get`): a guess that is never issued never needs them. ``row`` holds the
    logits (float16 or float32); ``probs``, when given, the row's softmax as the view made it
    (``view.lookahead_probs``: the numbers :func:`softmax_rows` gives, read instead of computed)."""

    __slots__ = ("row", "order", "k", "probs", "_scores")

    def __init__(self, row: np.ndarray, order: list[int], k: int, probs: np.ndarray | None = None) -> None:
        self.row = row
        self.order = order
        self.k = k
        self.probs = probs
        self._scores: list[float] | None = None

    def get(self) -> list[float]:
        """Softmax (float32) of the row at the first ``k`` experts of ``order``."""
        scores = self._scores
        if scores is None:
            probs = self.probs if self.probs is not None else softmax_rows(self.row[None])[0]
            best_l = probs.tolist()
            scores = self._scores = [best_l[e] for e in self.order[:self.k]]
        return scores

    def __getitem__(self, i: int) -> float:
        """The score of the ``i``-th expert of the order."""
        return self.get()[i]


def lookahead_guess(logits: np.ndarray, k: int, probs: np.ndarray | None = None
                    ) -> tuple[list[int], list[float] | RowScores, list[list[int]]] | None:
    """:func:`lookahead_ranking`, with the scores of a one-token ranking left to compute when
    first needed (a :class:`RowScores`); None for no tokens. ``probs``: the ``[1, E]`` softmax
    of a one-token ``logits`` as the view made it (``view.lookahead_probs``), or None."""
    if logits.shape[0] == 1 and logits.dtype.char in "ef":
        # float16 and float32 give the same Python floats as their float32 conversion
        row = logits[0]
        vals = row.tolist()
        if not math.isnan(sum(vals)):   # no NaN (nor inf - inf): Python sorts as numpy does
            # descending score, ties by id: argsort(-row, kind="stable"), as reverse=True keeps a
            # stable sort's order among equal keys
            order = sorted(range(len(vals)), key=vals.__getitem__, reverse=True)
            return order, RowScores(row, order, k, None if probs is None else probs[0]), [order]
    return lookahead_ranking(logits, k)


def lookahead_ranking(logits: np.ndarray, k: int) -> tuple[list[int], list[float], list[list[int]]] | None:
    """For ``[n, E]`` lookahead ``logits``: every expert by descending predicted score (ties by
    id), the scores of the first ``k``, and each token's own ranking; None for no tokens."""
    lg = np.asarray(logits, dtype=np.float32)
    if lg.shape[0] == 0:
        return None
    row = lg[0]
    if lg.shape[0] == 1:
        vals = row.tolist()
        if not math.isnan(sum(vals)):   # no NaN (nor inf - inf): Python sorts as numpy does
            order = sorted(range(len(vals)), key=vals.__getitem__, reverse=True)
            return order, RowScores(row, order, k).get(), [order]
    per = np.argsort(-lg, axis=1, kind="stable")
    if lg.shape[0] == 1:
        ranked = per[0]
        z = np.exp(row - row.max())
        best = z / z.sum()
    else:
        best = softmax_rows(lg).max(axis=0)
        ranked = np.argsort(-best, kind="stable")
    return ranked.tolist(), best[ranked[:k]].tolist(), per.tolist()
