"""ActiveEvict's expert importance (Eqs. 8-13) and release target (Eqs. 14-17), and the cache
rule that evicts by it.

* :class:`ImportanceScorer` keeps, for every layer, the indicator vectors of the experts
  *executed* there in the last ``window`` (T) iterations and scores residents with
  ``s(e) = alpha * h(e) + (1 - alpha) * p_hat(e)`` (Eq. 13), ``h`` the gamma-decayed usage
  (Eq. 8) normalised over the residents (Eq. 9).
* :func:`release_target` is Eq. 17: the prediction gap (Eq. 14) plus the boundary redundancy
  (Eq. 16).
* :class:`ImportanceCache` is the cache rule that names the resident of lowest ``s`` as victim
  (the demand evictions the pre-eviction did not prevent).

Readings where the paper is silent (spec sheet ``activeevict.md``, marked [rec] there):
executed = the plan that ran, not the recorded routing (dropped experts were not used); with
several tokens in an iteration ``I_t(e) = 1`` if any token ran ``e``; ``h = 0`` when the
residents' usage sums to 0; the redundancy sum is the literal Eq. 16 (``redundancy="literal"``)
or stops at the first gap of at least tau (``redundancy="run"``, section 7 A5); the gap counts
slots (``boundary="literal"``, Eq. 17) or the non-resident experts of the predicted
top-(k + r) (``boundary="nonresident"``, A6).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.parts.caches import CacheRule

SCORES = ("combined", "prediction", "hotness", "lru")
REDUNDANCY = ("literal", "run")
BOUNDARY = ("literal", "nonresident")


class ImportanceScorer:
    """Hotness windows and the importance score of Eq. 13.

    ``score``: ``combined`` (Eq. 13 with ``alpha``), ``prediction`` (alpha = 0), ``hotness``
    (alpha = 1) or ``lru`` (the ablation of Fig. 7: ``s`` = the iteration of last use, so the
    least recently used resident ranks lowest)."""

    def __init__(self, *, alpha: float, gamma: float, window: int, score: str) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
        if window < 1:
            raise ValueError(f"window (T) must be >= 1, got {window}")
        if score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
        self.alpha = {"prediction": 0.0, "hotness": 1.0}.get(score, alpha)
        self.gamma = gamma
        self.window = window
        self.score = score
        self.setup(1, 1)

    def setup(self, num_layers: int, num_experts: int) -> None:
        """Empty windows for ``num_layers`` layers of ``num_experts`` experts."""
        self.E = num_experts
        # per layer, the window's executed expert sets (ids without repeats), oldest first
        self.history: list[deque[list[int]]] = [deque(maxlen=self.window) for _ in range(num_layers)]
        self._weights = [1.0]   # gamma^age, by the repeated products of Eq. 8's loop
        for _ in range(self.window - 1):
            self._weights.append(self._weights[-1] * self.gamma)
        self.last_use = np.full((num_layers, num_experts), -1, dtype=np.int64)
        self.predicted: list[np.ndarray | None] = [None] * num_layers
        self._seen: set[tuple[int, int]] = set()

    def observe(self, iteration: int, layer: int, executed: Iterable[int]) -> None:
        """Push the experts executed at (``iteration``, ``layer``) into the layer's window (once
        per iteration and layer, whichever part calls first)."""
        if (iteration, layer) in self._seen:
            return
        if len(self._seen) > 4 * len(self.history):
            self._seen = {k for k in self._seen if k[0] >= iteration - 1}
        self._seen.add((iteration, layer))
        ids = [int(e) for e in executed if e >= 0]
        self.history[layer].append(list(dict.fromkeys(ids)))
        self.last_use[layer, ids] = iteration

    def usage(self, layer: int) -> np.ndarray:
        """Eq. 8: ``u(e) = sum_t gamma^(T - t) I_t(e)``, the newest iteration weighing 1."""
        u = [0.0] * self.E   # Python floats: the same double additions, newest first
        for ids, w in zip(reversed(self.history[layer]), self._weights, strict=False):   # window <= T
            for e in ids:
                u[e] += w
        return np.array(u)

    def hotness(self, layer: int, residents: Sequence[int]) -> dict[int, float]:
        """Eq. 9: usage normalised over the residents (all 0 when they were never used)."""
        u = self.usage(layer)
        tot = float(sum(u[e] for e in residents))
        return {e: (float(u[e]) / tot if tot > 0 else 0.0) for e in residents}

    def scores(self, layer: int, residents: Sequence[int], p_hat: np.ndarray | None = None
               ) -> dict[int, float]:
        """Eq. 13 for each resident (``p_hat``: the predicted distribution of ``layer``; the last
        one remembered when None, zeros before any)."""
        if self.score == "lru":
            return {e: float(self.last_use[layer, e]) for e in residents}
        if p_hat is None:
            p_hat = self.predicted[layer]
        h = self.hotness(layer, residents)
        a = self.alpha
        return {e: a * h[e] + (1.0 - a) * (float(p_hat[e]) if p_hat is not None else 0.0)
                for e in residents}


def release_target(p_hat: np.ndarray, present: set[int], top: Sequence[int], *, tau: float,
                   r_max: int, redundancy: str = "literal", boundary: str = "literal") -> int:
    """Eq. 17: ``Delta = (k - H_hat) + r_k``, ``top`` the predicted top-k (``k = len(top)``),
    ``H_hat`` how many of them are ``present`` (Eq. 14), ``r_k`` the flat gaps below the
    boundary (Eq. 16: ``sum_{j<r_max} [p_(k+j) - p_(k+j+1) < tau]``, 1-based ranks)."""
    srt = np.sort(np.asarray(p_hat, dtype=np.float64))[::-1]
    k = len(top)
    r = 0
    for j in range(r_max):
        a, b = k + j - 1, k + j            # 0-based positions of p_(k+j) and p_(k+j+1)
        if a < 0 or b >= len(srt):
            break
        if srt[a] - srt[b] < tau:
            r += 1
        elif redundancy == "run":
            break
    if boundary == "nonresident":
        order = np.argsort(-np.asarray(p_hat, dtype=np.float64), kind="stable")
        wanted = set(int(e) for e in top) | set(int(e) for e in order[: k + r])
        return len(wanted - present)
    hits = sum(1 for e in top if int(e) in present)
    return (k - hits) + r


class ImportanceCache(CacheRule):
    """Evict the resident of lowest importance ``s`` (Eq. 13) with the layer's last predicted
    distribution; the hotness windows are filled by whoever shares ``scorer`` (the
    pre-evictor), or by this rule itself from ``on_access`` when used alone."""

    def __init__(self, scorer: ImportanceScorer) -> None:
        super().__init__()
        self.scorer = scorer

    def setup(self, ctx: Context) -> None:
        """Empty windows."""
        self.scorer.setup(ctx.num_layers, ctx.num_experts)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Count the layer's executed experts (once per iteration and layer)."""
        plan = outcome.plan
        self.scorer.observe(view.iteration_index, layer, sorted({e for e in plan.ravel().tolist() if e >= 0}))

    def victim(self, view: View, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate of lowest ``s`` (ties: lowest expert id)."""
        by_layer: dict[int, dict[int, float]] = {}
        for layer in {k[0] for k in candidates}:
            res = sorted({k[1] for k in view.resident_units(view.pool_of(layer)) if k[0] == layer})
            by_layer[layer] = self.scorer.scores(layer, res)
        return min(candidates, key=lambda k: (by_layer[k[0]].get(k[1], 0.0), k[1], k[0], k[2]))
