"""MoEpic's statistics and cache configurator (Algorithm 1 of Yan, Liu, Xu, Huang: "Accelerating
Mixture-of-Expert Inference with Adaptive Expert Split Mechanism"; equation and line numbers are
the paper's). Pure numpy, no engine: :class:`SplitStats` records H_i(C), P_i(y) and PH_i(y, C);
:func:`solve_layer` is Eq. 11; :class:`CacheConfigurator` chains Eqs. 5-7 (ExpertSplit) and moves
budget between layers (VramAllocation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Latency inputs of Algorithm 1, in seconds: ``t_att`` (T_comp^att, the non-MoE part of a
    layer), ``t_moe`` (T_comp^moe, the ``top_k`` routed experts of a layer; T_comp^exp =
    ``t_moe / top_k``), ``t_head`` (T_comp^head), ``t_load`` (T_load^exp, one whole expert
    from host memory)."""

    t_att: float
    t_moe: float
    t_head: float
    t_load: float
    top_k: int

    @property
    def t_exp(self) -> float:
        return self.t_moe / self.top_k


@dataclass(frozen=True)
class LayerStats:
    """The three recorded probabilities of one layer with ``N`` experts (section 3.4.2):

    * ``hit[C]`` = H_i(C), the cache hit rate with a cache of size ``C`` (``C = 0..N``);
    * ``pred[y - 1]`` = P_i(y), activations of the expert with the y-th highest predicted
      score per token (``y = 1..N``);
    * ``pred_hit[y - 1, C]`` = PH_i(y, C), how often the y-th predicted expert is in the cache
      of size ``C``, per token.
    """

    hit: np.ndarray
    pred: np.ndarray
    pred_hit: np.ndarray

    @property
    def num_experts(self) -> int:
        return int(self.pred.shape[0])


class SplitStats:
    """Records H_i(C), P_i(y) and PH_i(y, C) (Algorithm 1, line 7) for all cache sizes at once.

    The cache of size ``C`` is the ``C`` experts of highest cache priority at the time of the
    token (what LCP keeps, and what the configurator installs), so an activated expert of
    priority rank ``r`` (0-based) hits every cache with ``C > r``: a histogram of ranks gives
    the whole curve, as stack distances do for LRU.

    The counts are Python lists, updated per token in Python: a layer has a handful of experts,
    where numpy's per-call cost would exceed the work.
    """

    def __init__(self, num_layers: int, num_experts: int) -> None:
        L, N = num_layers, num_experts
        self.num_experts = N
        self._rank_hist = [[0] * N for _ in range(L)]                       # activations at cache rank r
        self._activations = [0] * L                                         # q * K
        self._pred_act = [[0] * N for _ in range(L)]                        # activations of the y-th predicted
        self._pred_rank = [[[0] * N for _ in range(N)] for _ in range(L)]   # y-th predicted had cache rank r
        self._pred_tokens = [0] * L                                         # tokens with a prediction

    @property
    def rank_hist(self) -> np.ndarray:
        """``[L, N]``: activations of the expert at cache rank ``r`` (a copy)."""
        return np.array(self._rank_hist, dtype=np.int64)

    @property
    def activations(self) -> np.ndarray:
        """``[L]``: activations recorded (a copy)."""
        return np.array(self._activations, dtype=np.int64)

    @property
    def pred_act(self) -> np.ndarray:
        """``[L, N]``: activations of the ``y``-th predicted expert (a copy)."""
        return np.array(self._pred_act, dtype=np.int64)

    @property
    def pred_rank(self) -> np.ndarray:
        """``[L, N, N]``: tokens whose ``y``-th predicted expert had cache rank ``r`` (a copy)."""
        return np.array(self._pred_rank, dtype=np.int64)

    @property
    def pred_tokens(self) -> np.ndarray:
        """``[L]``: tokens recorded with a prediction (a copy)."""
        return np.array(self._pred_tokens, dtype=np.int64)

    def record(self, layer: int, experts: np.ndarray | list[list[int]], cache_order: Sequence[int] | np.ndarray,
               pred_order: Sequence[Sequence[int]] | np.ndarray | None) -> None:
        """One iteration at ``layer``: ``experts`` ``[n, k]`` activated (-1 = none),
        ``cache_order`` the experts by descending cache priority before these tokens,
        ``pred_order`` ``[n, N]`` each token's experts by descending predicted score (or None).
        Within one token an expert (or predicted position) named twice counts once; across the
        tokens of an iteration every activation counts."""
        N = self.num_experts
        rows = experts.tolist() if isinstance(experts, np.ndarray) else experts
        rank = [0] * N
        for r, e in enumerate(cache_order if cache_order.__class__ is list else _as_list(cache_order)):
            rank[e] = r
        hist = self._rank_hist[layer]
        acts = 0
        if len(rows) == 1:          # one token: an expert named twice counts once in the histogram
            valid = [e for e in rows[0] if e >= 0]
            if len(valid) == 2 and valid[0] != valid[1]:   # top-2, the common case: no set needed
                hist[rank[valid[0]]] += 1
                hist[rank[valid[1]]] += 1
            else:
                for e in set(valid):
                    hist[rank[e]] += 1
            acts = len(valid)
        else:
            for row in rows:
                for e in row:
                    if e >= 0:
                        hist[rank[e]] += 1
                        acts += 1
        self._activations[layer] += acts
        if pred_order is None:
            return
        pa, pr = self._pred_act[layer], self._pred_rank[layer]
        for t, row in enumerate(rows):
            order = pred_order[t]
            if order.__class__ is not list:
                order = _as_list(order)   # a permutation of the N experts
            for pr_y, e in zip(pr, order, strict=True):   # the y-th predicted expert's cache rank
                pr_y[rank[e]] += 1
            if len(row) == 2 and row[0] != row[1] and row[0] >= 0 and row[1] >= 0:
                pa[order.index(row[0])] += 1   # distinct experts: distinct positions
                pa[order.index(row[1])] += 1
            else:
                for y in {order.index(e) for e in row if e >= 0}:   # an activated expert's position
                    pa[y] += 1
        self._pred_tokens[layer] += len(rows)

    def layer(self, layer: int) -> LayerStats:
        """The probabilities of ``layer`` so far (zeros before any token)."""
        N = self.num_experts
        acts = max(1, self._activations[layer])
        hit = np.concatenate([[0.0], np.cumsum(np.array(self._rank_hist[layer], dtype=np.int64)) / acts])
        q = max(1, self._pred_tokens[layer])
        pred = np.array(self._pred_act[layer], dtype=np.int64) / q
        pred_rank = np.array(self._pred_rank[layer], dtype=np.int64)
        pred_hit = np.concatenate([np.zeros((N, 1)), np.cumsum(pred_rank, axis=1) / q], axis=1)
        return LayerStats(hit=hit, pred=pred, pred_hit=pred_hit)


def _as_list(order: Sequence[int] | np.ndarray) -> list[int]:
    """An order of experts as a list of Python ints (a list is read as it is, not copied)."""
    if isinstance(order, list):
        return order
    return order.tolist() if isinstance(order, np.ndarray) else list(order)


@dataclass(frozen=True)
class LayerSplit:
    """The solution of Eq. 11 for one layer: ``loaded`` (m_i, expected activated experts in
    VRAM when the routing is known), ``cache_size`` C_i* and ``theta`` (V_i / C_i*)."""

    loaded: float
    cache_size: int
    theta: float


def solve_layer(stats: LayerStats, budget: float, window: float, timing: Timing) -> LayerSplit:
    """Eq. 11: the cache size ``C`` in ``[ceil(V), N]`` (so that ``theta = V / C`` is in
    (0, 1]) maximising

        m(C) = K * H(C) * theta + sum_{y <= Y} [1 - PH(y, C) * theta] * P(y)        (Eqs. 10, 11)

    where ``Y`` is the number of prefetches, in predicted order, whose times
    ``[1 - PH(y, C) * theta] * T_load`` (Eq. 9) fit in ``window``, and at most ``K``: MoEpic
    prefetches only its ``K`` predicted experts (section 3.2), so no more can complete. A
    prefetch still under way when the window ends counts as nothing (the cut-off of Eq. 11).
    ``m`` is capped at ``K``; ties go to the smallest ``C`` (largest top segment). A budget of 0
    caches nothing and prefetches whole experts. ``budget`` is in experts."""
    N, K = stats.num_experts, timing.top_k
    P = stats.pred
    if budget <= 0:
        cum = np.cumsum(np.full(N, timing.t_load))
        Y = min(K, int((cum <= window * (1 + 1e-12)).sum()))
        return LayerSplit(loaded=min(float(K), float(P[:Y].sum())), cache_size=0, theta=0.0)
    c_lo = min(N, max(1, math.ceil(budget - 1e-9)))
    C = np.arange(c_lo, N + 1)
    theta = np.minimum(1.0, budget / C)
    frac = 1.0 - stats.pred_hit[:, C] * theta[None, :]                 # [N, nC]: share to fetch
    cum = np.cumsum(frac * timing.t_load, axis=0)                      # Eq. 9, summed over y
    Y = np.minimum(K, (cum <= window * (1 + 1e-12)).sum(axis=0))      # prefetches that fit, <= K
    cum_a = np.vstack([np.zeros((1, C.size)), np.cumsum(frac * P[:, None], axis=0)])   # Eq. 10
    m = K * stats.hit[C] * theta + cum_a[Y, np.arange(C.size)]
    m = np.minimum(m, float(K))
    j = int(np.argmax(m))
    return LayerSplit(loaded=float(m[j]), cache_size=int(C[j]), theta=float(theta[j]))


@dataclass(frozen=True)
class SplitResult:
    """ExpertSplit of a budget vector: per layer the exposed loading latency 𝒯^i (Eq. 6,
    seconds), the prefetch window T_wind^i (Eq. 7) it was solved with, and the split."""

    exposed: np.ndarray
    window: np.ndarray
    splits: list[LayerSplit]

    @property
    def theta(self) -> np.ndarray:
        return np.array([s.theta for s in self.splits])

    @property
    def cache_size(self) -> np.ndarray:
        return np.array([s.cache_size for s in self.splits], dtype=np.int64)


@dataclass(frozen=True)
class Allocation:
    """VramAllocation's answer: budgets ``V_i`` (experts), their split, and the number of
    budget moves made."""

    budgets: np.ndarray
    split: SplitResult
    moves: int

    @property
    def theta(self) -> np.ndarray:
        return self.split.theta

    @property
    def cache_size(self) -> np.ndarray:
        return self.split.cache_size

    @property
    def total_exposed(self) -> float:
        return float(self.split.exposed.sum())


@dataclass
class CacheConfigurator:
    """Algorithm 1 of the paper, on recorded statistics and latency metrics; no engine.

    ``total`` is V_e, the expert budget in experts; ``zeta`` the allocation granularity (a move
    shifts ``zeta * total`` experts of budget); budgets stay in ``(min_budget, num_experts]``
    (``min_budget`` 0: strictly positive, as Eq. 8 asks).
    """

    timing: Timing
    total: float
    zeta: float = 0.01
    min_budget: float = 0.0
    max_moves: int = 100_000
    moves_log: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def expert_split(self, stats: Sequence[LayerStats], budgets: Sequence[float] | np.ndarray) -> SplitResult:
        """Function ExpertSplit (lines 29-35): solve Eq. 11 layer by layer, the window of
        each layer following from the previous one by Eqs. 5-7, with ``m_i`` standing for
        ``alpha_i + beta_i * theta_i`` and ``K - m_i`` for ``beta_i (1 - theta_i) + gamma_i``."""
        tm = self.timing
        K = tm.top_k
        window = tm.t_head + tm.t_att                       # T_wind^1 (line 30)
        exposed = np.zeros(len(stats))
        windows = np.zeros(len(stats))
        splits: list[LayerSplit] = []
        for i, (st, v) in enumerate(zip(stats, budgets, strict=True)):
            windows[i] = window
            sp = solve_layer(st, float(v), window, tm)
            splits.append(sp)
            hide = sp.loaded * tm.t_exp                      # Eq. 5
            miss = (K - sp.loaded) * tm.t_load               # T_miss^i
            exposed[i] = max(0.0, miss - hide)               # Eq. 6
            window = (tm.t_moe - min(hide, miss)) + tm.t_att  # Eq. 7
        return SplitResult(exposed=exposed, window=windows, splits=splits)

    def _feasible(self, v: np.ndarray, n_experts: int) -> np.ndarray:
        return (v > max(self.min_budget - 1e-9, 1e-9)) & (v <= n_experts + 1e-9)

    def allocate(self, stats: Sequence[LayerStats], budgets: Sequence[float] | np.ndarray) -> Allocation:
        """Function VramAllocation (lines 13-26): move ``zeta * total`` experts of budget from
        the layer whose reduction costs least (𝒯_3 - 𝒯_1) to the one whose increase profits
        most (𝒯_1 - 𝒯_2), both estimated with ExpertSplit of all budgets shifted at once,
        while the total exposed latency strictly falls; the move that does not is rolled back."""
        V = np.asarray(budgets, dtype=np.float64).copy()
        n_exp = stats[0].num_experts
        step = self.zeta * self.total
        self.moves_log.clear()
        r1 = self.expert_split(stats, V)
        moves = 0
        while moves < self.max_moves:
            up, down = V + step, V - step
            r2 = self.expert_split(stats, np.minimum(up, n_exp))
            r3 = self.expert_split(stats, np.maximum(down, 0.0))
            profit = np.where(self._feasible(up, n_exp), r1.exposed - r2.exposed, -np.inf)
            cost = np.where(self._feasible(down, n_exp), r3.exposed - r1.exposed, np.inf)
            i1 = int(np.argmax(profit))                      # line 19
            cost[i1] = np.inf
            i2 = int(np.argmin(cost))                        # line 20
            if not np.isfinite(profit[i1]) or not np.isfinite(cost[i2]):
                break
            V2 = V.copy()
            V2[i1] += step                                   # line 21
            V2[i2] -= step
            r4 = self.expert_split(stats, V2)                # line 22
            if float((r4.exposed - r1.exposed).sum()) >= 0:  # line 23: roll back and stop
                break
            V, r1 = V2, r4
            moves += 1
            self.moves_log.append((i1, i2))
        return Allocation(budgets=V, split=r1, moves=moves)


def split_fractions(theta: float) -> tuple[float, ...]:
    """Part fractions of an expert with top share ``theta``: two segments inside (0, 1), one
    whole part at the ends."""
    return (float(theta), 1.0 - float(theta)) if 0.0 < theta < 1.0 else (1.0,)


def pool_splits(alloc: Allocation, expert_bytes: int, total_bytes: int
                ) -> tuple[list[int], list[tuple[float, ...]], list[float]]:
    """An allocation as installed: per layer the pool's bytes, the part fractions and ``theta``.
    A layer caching no expert holds nothing and streams whole experts; ``theta`` 1 caches whole
    experts; otherwise each of the ``C_i`` tops gets ``V_i / C_i`` bytes (whole bytes, ``theta``
    rounded to them). Float rounding can put the sum a few bytes over ``total_bytes``: the
    largest pool gives them back."""
    caps: list[int] = []
    fracs: list[tuple[float, ...]] = []
    thetas: list[float] = []
    for i in range(len(alloc.budgets)):
        v, c = float(alloc.budgets[i]), int(alloc.cache_size[i])
        theta = float(alloc.theta[i])
        fr: tuple[float, ...]
        if c == 0:
            theta, fr, cap = 0.0, (1.0,), 0
        elif theta >= 1.0 - 1e-12:
            theta, fr, cap = 1.0, (1.0,), c * expert_bytes
        else:
            top = int(v * expert_bytes) // c
            theta = top / expert_bytes
            fr, cap = split_fractions(theta), c * top
        caps.append(cap)
        fracs.append(fr)
        thetas.append(theta)
    if sum(caps) > total_bytes:
        j = int(np.argmax(caps))
        caps[j] -= sum(caps) - total_bytes
    return caps, fracs, thetas
