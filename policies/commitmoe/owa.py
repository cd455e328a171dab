"""CommitMoE's Output Weight Adjustment (OWA, section 4.2, Eqs. 5-6) and its accuracy measure
(Eq. 3), as pure functions.

When a token's committed (predicted) experts share ``c`` experts with the true routing and ``c``
lies in the trigger set (high but not perfect: Mixtral {1}, Qwen1.5-MoE {2, 3}, DeepSeek-V2-Lite
{4, 5}, section 5.2), the combination weights of the committed experts are re-weighted:

* Eq. (5): a correctly predicted expert ``k`` gets ``G_true[k] * (1 + M_miss / M_corr) * alpha1``,
  where ``M_miss`` is the true mass of the missed experts and ``M_corr`` that of the correct ones;
  a wrongly predicted expert keeps ``G_pred[k]``;
* Eq. (6): all are scaled so that they sum to ``alpha2`` times the true top-k mass.

Outside the trigger set the committed experts run with ``G_pred`` (spec sheet C7). Weights are
router probabilities (softmax over all experts, not renormalised), as the trace's ``weights``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PAPER_TRIGGERS = {2: frozenset({1}), 4: frozenset({2, 3}), 6: frozenset({4, 5})}
"""The paper's trigger sets by top-k (section 5.2: Mixtral k=2, Qwen1.5-MoE k=4, DeepSeek-V2-Lite k=6)."""


def default_trigger(k: int) -> frozenset[int]:
    """The trigger set for top-``k``: the paper's for k = 2, 4, 6; otherwise (our assumption,
    'high but not perfect') every ``c`` with ``k/2 <= c < k``."""
    if k in PAPER_TRIGGERS:
        return PAPER_TRIGGERS[k]
    return frozenset(c for c in range(1, k) if 2 * c >= k)


def commit_accuracy(correct: int, k: int) -> int:
    """Eq. (3): ``round(correct / k * 100)`` in percent, halves rounded up (k=6, 4 correct -> 67)."""
    if k <= 0 or not 0 <= correct <= k:
        raise ValueError(f"commit accuracy needs 0 <= correct <= k and k >= 1, got {correct}, {k}")
    return int(math.floor(100 * correct / k + 0.5))


def owa_weights(true_experts: Sequence[int], true_weights: Sequence[float], pred_experts: Sequence[int],
                pred_weights: Sequence[float], *, alpha1: float, alpha2: float) -> np.ndarray:
    """G'' of Eqs. (5)-(6) for ``pred_experts`` (in their order), from the true routing's experts
    and weights and the predictor's weights of the predicted experts. With no correct expert
    there is nothing to redistribute to: the predictor's weights come back unchanged."""
    return np.array(owa_weight_list(true_experts, true_weights, pred_experts, pred_weights,
                                    alpha1=alpha1, alpha2=alpha2), dtype=np.float64)


def owa_weight_list(true_experts: Sequence[int], true_weights: Sequence[float], pred_experts: Sequence[int],
                    pred_weights: Sequence[float], *, alpha1: float, alpha2: float) -> list[float]:
    """:func:`owa_weights` as a list of Python floats (once per committed token, where a small
    array costs more than the arithmetic): the same float64 operations in the same order."""
    g_true = {int(e): float(w) for e, w in zip(true_experts, true_weights, strict=True)}
    correct = [int(e) for e in pred_experts if int(e) in g_true]
    if not correct:
        return [float(w) for w in pred_weights]
    m_corr = sum(g_true[e] for e in correct)
    hit = set(correct)
    m_miss = sum(w for e, w in g_true.items() if e not in hit)
    factor = (1.0 + m_miss / m_corr) * alpha1 if m_corr > 0 else alpha1
    g1 = [g_true[int(e)] * factor if int(e) in g_true else float(pw)
          for e, pw in zip(pred_experts, pred_weights, strict=True)]
    # numpy's sum of one or two float64 values is the plain sum; of more, its pairwise order
    total = (g1[0] if len(g1) == 1 else g1[0] + g1[1] if len(g1) == 2
             else float(np.array(g1, dtype=np.float64).sum()))
    if total <= 0:
        return g1
    scale = sum(g_true.values()) / total
    return [g * scale * alpha2 for g in g1]
