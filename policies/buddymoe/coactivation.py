"""Co-activation profile and buddy lists (BuddyMoE, Wang et al., PPoPP 2026, section 3.2-3.3).

For each MoE layer ``l`` a profile counts, over profiling tokens ``x``:

* ``A[l, i]``: tokens whose top-k set ``S_l(x)`` holds expert ``i`` (activations);
* ``M[l, i, j]``: tokens whose set holds both ``i`` and ``j != i`` (co-activations, symmetric).
  The *weighted* variant (section 3.3 (i)) adds ``min(p~(i|x), p~(j|x))`` instead of 1, with
  ``p~`` the router probabilities renormalised over ``S_l(x)``.

From ``M`` (plus ``epsilon`` off the diagonal, Laplace smoothing, section 3.3 (ii)):

* Eq. (4): ``q[l, j | i] = M[l, i, j] / sum_j' M[l, i, j']``, ``q[l, i | i] = 0``;
* Eq. (5): ``pi_i`` = peers by ``q`` descending (ties: higher ``A[l, j]``, then lower id), and
  ``t_i(alpha)`` the shortest prefix whose ``q`` sums to at least ``alpha`` (float tolerance
  1e-12); when no prefix reaches it, every peer with ``q > 0``;
* Eq. (6): ``B[l, i] = pi_i(1 .. min(t_i(alpha), K_max))``; an expert never active in the
  profile (``A[l, i] = 0``) has no buddies.

Everything here is a pure function of counts, so it is unit-tested on hand-made profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BuddyLists = list[list[list[int]]]
"""``lists[layer][expert]``: the expert's buddies, best first (Eq. 6)."""

COACTIVATION_MODES = ("binary", "weighted")


def renormalised(weights: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Top-k router probabilities renormalised over the top-k set, sharpened or flattened by
    ``temperature`` T: ``w**(1/T) / sum(w**(1/T))`` along the last axis (equal to the softmax of
    ``logits / T`` restricted to the set). A row of zeros stays zero."""
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    if temperature != 1.0:
        w = w ** (1.0 / temperature)
    s = w.sum(axis=-1, keepdims=True)
    return np.divide(w, s, out=np.zeros_like(w), where=s > 0)


def coactivation_counts(experts: np.ndarray, num_experts: int, weights: np.ndarray | None = None,
                        mode: str = "binary") -> tuple[np.ndarray, np.ndarray]:
    """``(A, M)`` of a profile: ``experts`` is ``[T, L, k]`` (ids; negative ids are ignored),
    ``weights`` the matching router probabilities (needed for ``mode="weighted"``). Returns
    ``A`` ``[L, E]`` activation counts and ``M`` ``[L, E, E]`` symmetric co-activation counts
    (binary) or mass (weighted) with a zero diagonal."""
    if mode not in COACTIVATION_MODES:
        raise ValueError(f"coactivation must be one of {', '.join(COACTIVATION_MODES)}, got {mode!r}")
    ex = np.asarray(experts)
    if ex.ndim != 3:
        raise ValueError(f"experts must be [tokens, layers, k]; got shape {ex.shape}")
    if mode == "weighted" and weights is None:
        raise ValueError("the weighted co-activation needs router weights")
    T, L, k = ex.shape
    E = num_experts
    A = np.zeros((L, E), dtype=np.float64)
    M = np.zeros((L, E, E), dtype=np.float64)
    p = renormalised(weights) if (mode == "weighted" and weights is not None) else None
    for layer in range(L):
        rows = ex[:, layer, :].astype(np.int64)
        valid = rows >= 0
        np.add.at(A[layer], rows[valid], 1.0)
        for r in range(k):
            for s in range(r + 1, k):
                ok = valid[:, r] & valid[:, s] & (rows[:, r] != rows[:, s])
                i, j = rows[ok, r], rows[ok, s]
                val = np.ones(len(i)) if p is None else np.minimum(p[ok, layer, r], p[ok, layer, s])
                np.add.at(M[layer], (i, j), val)
                np.add.at(M[layer], (j, i), val)
    return A, M


def conditional(M: np.ndarray, epsilon: float = 0.0) -> np.ndarray:
    """Eq. (4): ``q[l, j | i]`` from ``M`` ``[L, E, E]`` with ``epsilon`` added off the diagonal
    (the diagonal stays 0, so ``q[l, i | i] = 0``). A row with no mass is all zeros."""
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    E = M.shape[-1]
    off = 1.0 - np.eye(E)
    m = (M + epsilon) * off
    s = m.sum(axis=-1, keepdims=True)
    return np.divide(m, s, out=np.zeros_like(m), where=s > 0)


def _per_layer(value: float | Sequence[float], L: int, name: str) -> list[float]:
    vals = [float(value)] * L if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(vals) != L:
        raise ValueError(f"{name} has {len(vals)} values for {L} layers")
    return vals


def buddy_lists(q: np.ndarray, A: np.ndarray, alpha: float | Sequence[float], k_max: int) -> BuddyLists:
    """Eqs. (5)-(6): each expert's buddies, best first, covering at least ``alpha`` of its
    conditional co-activation mass (``alpha`` a float or one per layer, in (0, 1]), at most
    ``k_max`` of them. Ties in ``q`` go to the more active peer, then the lower id."""
    L, E = A.shape
    alphas = _per_layer(alpha, L, "alpha")
    if any(not 0 < a <= 1 for a in alphas):
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    # every layer and expert at once: sort each row of q (last key first: q desc, A desc, id asc)
    peers = np.array(q, dtype=np.float64)
    peers[:, np.arange(E), np.arange(E)] = 0.0   # an expert is never its own buddy
    ids = np.broadcast_to(np.arange(E), (L, E, E))
    act = np.broadcast_to(-A[:, None, :], (L, E, E))
    order = np.lexsort((ids, act, -peers), axis=-1)             # [L, E, E]
    vals = np.take_along_axis(peers, order, axis=-1)
    # peers with q > 0 come first in that order (q >= 0), so the cumulative sums of
    # the whole sorted row are those of the peers: adding the zeros after them changes nothing
    n_peers = (vals > 0).sum(axis=-1)                              # [L, E]
    cum = np.cumsum(vals, axis=-1)
    reach = (cum >= np.asarray(alphas)[:, None, None] - 1e-12) & (vals > 0)
    first = np.where(reach.any(axis=-1), reach.argmax(axis=-1) + 1, n_peers)
    keep = np.minimum(first, k_max)
    keep[(A <= 0) | (q.sum(axis=-1) <= 0)] = 0   # never active, or no co-activation mass
    order_l, keep_l = order.tolist(), keep.tolist()
    return [[order_l[layer][i][:keep_l[layer][i]] for i in range(E)] for layer in range(L)]


def buddy_row(counts: Sequence[float], activations: Sequence[float], expert: int, alpha: float,
              k_max: int) -> list[int]:
    """One expert's buddies, exactly as :func:`buddy_lists` gives them with ``epsilon = 0`` when
    every count is an integer (the binary profile): ``counts`` is the expert's row ``M[l, i]``,
    ``activations`` the layer's ``A[l]``, ``alpha`` the layer's. Plain Python on one row, for a
    planner that asks for a few rows of a profile that changes every iteration: the row total is
    a sum of integers, exact in any order, each ``q`` the correctly rounded quotient numpy's
    division gives, the cumulative sum the same left-to-right one as ``np.cumsum``, and the
    order the lexsort's (``q`` descending, ``A`` descending, id ascending)."""
    m = [0.0 if j == expert else c + 0.0 for j, c in enumerate(counts)]
    tot = sum(m)
    if activations[expert] <= 0 or not tot > 0:
        return []
    q = [c / tot for c in m]
    order = sorted(range(len(q)), key=lambda j: (-q[j], -activations[j], j))
    thr = alpha - 1e-12
    cum = 0.0
    n_peers = 0
    first = -1
    for j in order:
        v = q[j]
        if not v > 0:
            break
        n_peers += 1
        cum += v
        if first < 0 and cum >= thr:
            first = n_peers
            break
    if first < 0:   # never reached: every peer with q > 0 (they all came first)
        first = n_peers
    return order[:min(first, k_max)]


@dataclass
class CoactivationProfile:
    """The counts of a co-activation profile: ``activations`` ``A`` ``[L, E]`` and
    ``coactivations`` ``M`` ``[L, E, E]`` (see the module docstring). Built from a profiling
    split (:meth:`from_routing`) or grown token by token from routing already seen
    (:meth:`add`, causal)."""

    activations: np.ndarray
    coactivations: np.ndarray
    mode: str = "binary"

    @classmethod
    def empty(cls, num_layers: int, num_experts: int, mode: str = "binary") -> CoactivationProfile:
        """A profile with no tokens."""
        if mode not in COACTIVATION_MODES:
            raise ValueError(f"coactivation must be one of {', '.join(COACTIVATION_MODES)}, got {mode!r}")
        return cls(np.zeros((num_layers, num_experts)), np.zeros((num_layers, num_experts, num_experts)), mode)

    @classmethod
    def from_routing(cls, experts: np.ndarray, num_experts: int, weights: np.ndarray | None = None,
                     mode: str = "binary") -> CoactivationProfile:
        """The profile of ``experts`` ``[T, L, k]`` (and ``weights``, for ``mode="weighted"``)."""
        A, M = coactivation_counts(experts, num_experts, weights, mode)
        return cls(A, M, mode)

    def add(self, layer: int, experts: np.ndarray, weights: np.ndarray | None) -> None:
        """Count the ``[n, k]`` routing of ``layer`` for ``n`` more tokens."""
        if self.mode == "binary" and len(experts) == 1:
            # one token (decode at batch 1): the counts of coactivation_counts, added in Python
            row = [e for e in experts[0].tolist() if e >= 0]
            act, co = self.activations[layer], self.coactivations[layer]
            for e in row:
                act[e] += 1.0
            for r, i in enumerate(row):
                for j in row[r + 1:]:
                    if i != j:
                        co[i, j] += 1.0
                        co[j, i] += 1.0
            return
        ex = np.asarray(experts)[:, None, :]
        w = None if weights is None else np.asarray(weights)[:, None, :]
        A, M = coactivation_counts(ex, self.activations.shape[1], w, self.mode)
        self.activations[layer] += A[0]
        self.coactivations[layer] += M[0]

    def buddies(self, alpha: float | Sequence[float], k_max: int, epsilon: float = 0.0
                ) -> tuple[BuddyLists, np.ndarray]:
        """``(B, q)``: the buddy lists (Eqs. 4-6) and the conditional matrix they come from."""
        q = conditional(self.coactivations, epsilon)
        return buddy_lists(q, self.activations, alpha, k_max), q
