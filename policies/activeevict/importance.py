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
slots (``boundary="literal"``, Eq. 17 as printed) or the non-resident experts of the
predicted top-(k + r) (``boundary="nonresident"``, A6: Eq. 14's discount of the residents
applied to the boundary experts too, so a resident rank-(k + 1) expert is kept rather than
evicted to make a slot for itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    ReadView,
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
        # per layer and expert, the iterations it was executed in as the bits of an int: bit j is
        # the layer's j-th observed iteration since an origin that observe moves forward now and
        # then; ``_count[layer]`` iterations observed since the origin (the window is the newest
        # ``min(count, T)`` of them)
        self._bits = [[0] * num_experts for _ in range(num_layers)]
        self._count = [0] * num_layers
        self._weights = [1.0]   # gamma^age, by the repeated products of Eq. 8's loop
        for _ in range(self.window - 1):
            self._weights.append(self._weights[-1] * self.gamma)
        self.last_use = [[-1] * num_experts for _ in range(num_layers)]
        self.predicted: list[Sequence[float] | None] = [None] * num_layers
        self._last_it: list[int | None] = [None] * num_layers   # iteration last observed per layer

    def observe(self, iteration: int, layer: int, executed: Iterable[int]) -> None:
        """Push the experts executed at (``iteration``, ``layer``) into the layer's window (once
        per iteration and layer, whichever part calls first)."""
        if self._last_it[layer] == iteration:
            return
        self._last_it[layer] = iteration
        bits, n = self._bits[layer], self._count[layer]
        if n >= 4 * self.window:   # move the origin: drop the bits older than the window
            drop = n - self.window
            for e in range(self.E):
                bits[e] >>= drop
            n -= drop
        bit = 1 << n
        last = self.last_use[layer]
        for e in executed:
            if e >= 0:
                e = int(e)
                bits[e] |= bit
                last[e] = iteration
        self._count[layer] = n + 1

    def observe_plan(self, iteration: int, layer: int, plan: np.ndarray) -> None:
        """:meth:`observe` the experts of an executed ``plan`` (``-1`` for none)."""
        if self._last_it[layer] != iteration:
            self.observe(iteration, layer, set(plan.ravel().tolist()))

    def _usage_of(self, layer: int, expert: int) -> float:
        """Eq. 8 for one expert: the window's weights of its iterations added newest first (the
        same double additions, in the same order, as summing the window's indicator vectors)."""
        n = self._count[layer]
        size = min(n, self.window)
        m = self._bits[layer][expert] >> (n - size)   # bit p: age size - 1 - p
        w = self._weights
        top = size - 1
        u = 0.0
        while m:
            p = m.bit_length() - 1
            u += w[top - p]
            m ^= 1 << p
        return u

    def usage(self, layer: int) -> np.ndarray:
        """Eq. 8: ``u(e) = sum_t gamma^(T - t) I_t(e)``, the newest iteration weighing 1."""
        return np.array([self._usage_of(layer, e) for e in range(self.E)])

    def hotness(self, layer: int, residents: Sequence[int]) -> dict[int, float]:
        """Eq. 9: usage normalised over the residents (all 0 when they were never used)."""
        u = [self._usage_of(layer, e) for e in residents]
        tot = 0.0   # a plain loop: the residents' usage added in their order
        for x in u:
            tot += x
        if tot > 0:
            return {e: x / tot for e, x in zip(residents, u, strict=True)}
        return dict.fromkeys(residents, 0.0)

    def scores(self, layer: int, residents: Sequence[int], p_hat: Sequence[float] | None = None
               ) -> dict[int, float]:
        """Eq. 13 for each resident (``p_hat``: the predicted distribution of ``layer``; the last
        one remembered when None, zeros before any)."""
        if self.score == "lru":
            last = self.last_use[layer]
            return {e: float(last[e]) for e in residents}
        if p_hat is None:
            p_hat = self.predicted[layer]
        h = self.hotness(layer, residents)
        a = self.alpha
        b = 1.0 - a
        if p_hat is None:
            return {e: a * h[e] + b * 0.0 for e in residents}
        return {e: a * h[e] + b * float(p_hat[e]) for e in residents}


def descending(p: Sequence[float]) -> list[int]:
    """Indices of ``p`` by descending value, ties by index: ``np.argsort(-p, kind="stable")``
    (NaNs last, by index, as numpy sorts them)."""
    t = sum(p)
    if t == t:   # no NaN: sorted(reverse=True) keeps the index order of ties
        return sorted(range(len(p)), key=p.__getitem__, reverse=True)
    nan = [i for i, x in enumerate(p) if x != x]
    rest = [i for i, x in enumerate(p) if x == x]
    return sorted(rest, key=p.__getitem__, reverse=True) + nan


def release_target(p_hat: Sequence[float] | np.ndarray, present: set[int], top: Sequence[int], *, tau: float,
                   r_max: int, redundancy: str = "literal", boundary: str = "literal") -> int:
    """Eq. 17: ``Delta = (k - H_hat) + r_k``, ``top`` the predicted top-k (``k = len(top)``),
    ``H_hat`` how many of them are ``present`` (Eq. 14), ``r_k`` the flat gaps below the
    boundary (Eq. 16: ``sum_{j<r_max} [p_(k+j) - p_(k+j+1) < tau]``, 1-based ranks)."""
    p = np.asarray(p_hat, dtype=np.float64).tolist()
    return release_target_of(p, present, top, tau=tau, r_max=r_max, redundancy=redundancy, boundary=boundary)


def release_target_of(p: Sequence[float], present: set[int], top: Sequence[int], *, tau: float, r_max: int,
                      redundancy: str = "literal", boundary: str = "literal") -> int:
    """:func:`release_target` of ``p`` given as Python floats (the pre-evictor's per-layer call)."""
    return release_plan(p, present, top, tau=tau, r_max=r_max, redundancy=redundancy, boundary=boundary)[0]


def redundancy_of(p: Sequence[float], k: int, *, tau: float, r_max: int, redundancy: str = "literal",
                  order: Sequence[int] | None = None) -> int:
    """Eq. 16: ``r_k``, the gaps below ``p_(k)`` narrower than ``tau`` among the first ``r_max``
    (``redundancy="run"``: stop at the first that is not). ``order``: ``descending(p)``, when the
    caller has it (the same values in the same order, without a second sort)."""
    r = 0
    if r_max > 0 and k < len(p):
        if order is not None:  # p by ``order``, its NaNs (last there) moved first, as below
            srt = [p[i] for i in order]
            m = len(srt)
            while m and srt[m - 1] != srt[m - 1]:
                m -= 1
            srt = srt[m:] + srt[:m]
        elif (t := sum(p)) == t:   # no NaN: the values, highest first
            srt = sorted(p, reverse=True)
        else:                  # numpy's descending order puts the NaNs first
            srt = [x for x in p if x != x] + sorted((x for x in p if x == x), reverse=True)
        for j in range(r_max):
            a, b = k + j - 1, k + j            # 0-based positions of p_(k+j) and p_(k+j+1)
            if a < 0 or b >= len(srt):
                break
            if srt[a] - srt[b] < tau:
                r += 1
            elif redundancy == "run":
                break
    return r


def release_plan(p: Sequence[float], present: set[int], top: Sequence[int], *, tau: float, r_max: int,
                 redundancy: str = "literal", boundary: str = "literal", order: list[int] | None = None
                 ) -> tuple[int, set[int]]:
    """Eq. 17's target and the experts it makes room for or counts as already there: the
    predicted top-k (``top``), and with ``boundary="nonresident"`` also the ``r_k`` experts
    just below the boundary (ranks k+1..k+r of ``p``), whose slots the redundancy is for. The
    pre-evictor never evicts one of these (A4): evicting a resident it counted as present would
    free a slot for the very expert it evicted. ``order``: ``descending(p)``, when the caller has it."""
    k = len(top)
    if boundary == "nonresident":
        if order is None:
            order = descending(p)
        r = redundancy_of(p, k, tau=tau, r_max=r_max, redundancy=redundancy, order=order)
        wanted = set(map(int, top))
        wanted.update(order[: k + r])
        return len(wanted - present), wanted
    r = redundancy_of(p, k, tau=tau, r_max=r_max, redundancy=redundancy)
    hits = 0
    for e in top:
        if int(e) in present:
            hits += 1
    return (k - hits) + r, set(int(e) for e in top)


class ImportanceCache(CacheRule):
    """Evict the resident of lowest importance ``s`` (Eq. 13) with the layer's last predicted
    distribution; the hotness windows are filled by whoever shares ``scorer`` (the
    pre-evictor, ``fills_windows=False``), or by this rule itself from ``on_access`` when used alone."""

    def __init__(self, scorer: ImportanceScorer, *, fills_windows: bool = True) -> None:
        super().__init__()
        self.scorer = scorer
        self.fills_windows = fills_windows

    def setup(self, ctx: Context) -> None:
        """Empty windows."""
        self.scorer.setup(ctx.num_layers, ctx.num_experts)

    def uses_hook(self, name: str) -> bool:
        """``on_access`` only when this rule fills the windows itself (``fills_windows``; not when
        the pre-evictor that shares ``scorer`` does)."""
        if name == "on_access":
            return self.fills_windows
        return super().uses_hook(name)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Count the layer's executed experts (once per iteration and layer)."""
        self.scorer.observe_plan(view.iteration_index, layer, outcome.plan)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        """The candidate of lowest ``s`` (ties: lowest expert id)."""
        by_layer: dict[int, dict[int, float]] = {}
        for layer in {k[0] for k in candidates}:
            res = sorted({k[1] for k in view.resident_units(view.pool_of(layer)) if k[0] == layer})
            by_layer[layer] = self.scorer.scores(layer, res)
        return min(candidates, key=lambda k: (by_layer[k[0]].get(k[1], 0.0), k[1], k[0], k[2]))
