"""MoEpic's speculative guess from the lookahead router (section 3.2, Eq. 3): the experts of the
next layer ranked by the softmax of the router applied to the current hidden state (the trace's
``lookahead_logits``), the best score over the iteration's tokens."""

from __future__ import annotations

import math

import numpy as np

from moesim.policies.parts.predictors import softmax_rows


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
            # descending score, ties by id: argsort(-row, kind="stable"), as reverse=True keeps a
            # stable sort's order among equal keys
            order = sorted(range(len(vals)), key=vals.__getitem__, reverse=True)
            # the first is the maximum (of +0 and -0 either: x - 0 and x - (-0) differ only in
            # the sign of a zero, and exp of either is 1)
            # the maximum as a Python float: a weak scalar, subtracted in float32 all the same
            z = np.exp(row - vals[order[0]])
            z /= z.sum()
            best_l = z.tolist()
            return order, [best_l[e] for e in order[:k]], [order]
    per = np.argsort(-lg, axis=1, kind="stable")
    if lg.shape[0] == 1:
        ranked = per[0]
        z = np.exp(row - row.max())
        best = z / z.sum()
    else:
        best = softmax_rows(lg).max(axis=0)
        ranked = np.argsort(-best, kind="stable")
    return ranked.tolist(), best[ranked[:k]].tolist(), per.tolist()
