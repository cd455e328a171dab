"""fMoE's Expert Map Store (fMoE paper, sections 4.1-4.4): up to ``capacity`` past iterations, each an *expert map* (the router's full
probability vector ``P_l`` for every layer, ``[L, J]``) and the iteration's semantic embedding.

* Semantic matching (Eq. 4): the stored map of highest cosine similarity between embeddings.
* Trajectory matching (Eq. 5): the stored map whose layers ``0..l`` are most cosine-similar to
  the probabilities observed so far, computed incrementally (a running dot product per stored
  map and cumulative norms of the stored prefixes), so each routed layer costs ``O(C * J)``.
* Replacement (section 4.4): once full, a new map overwrites the stored one of highest
  redundancy ``RDY = (d / L) * cos_sem + ((L - d) / L) * cos_map`` (the closest one; [rec] B8:
  no threshold, the trajectory term over all L layers).
* :func:`select_by_mass` is Eqs. 6-8: experts in descending probability until their mass
  reaches ``delta`` and at least ``K`` of them ([rec] B5: ``>= K``, a 1e-9 tolerance on the mass).
"""

from __future__ import annotations

import numpy as np


def select_by_mass(p: np.ndarray, delta: float, k: int, dynamic: bool = True) -> list[tuple[int, float]]:
    """``(expert, probability)`` of the smallest prefix of ``p`` in descending order whose mass
    is at least ``delta`` and which holds at least ``k`` experts (only ``k`` without
    ``dynamic``); experts of probability 0 are never added beyond ``k``."""
    order = np.argsort(-p, kind="stable")
    n = k
    if dynamic:
        csum = np.cumsum(p[order])
        reach = np.nonzero(csum >= delta - 1e-9)[0]
        need = int(reach[0]) + 1 if len(reach) else int(np.count_nonzero(p))
        n = max(k, min(need, int(np.count_nonzero(p))))
    n = min(n, len(p))
    return [(int(e), float(p[e])) for e in order[:n]]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with ``b`` (0 where a norm is 0)."""
    na = np.linalg.norm(a, axis=1)
    nb = float(np.linalg.norm(b))
    dots = a @ b
    den = na * nb
    return np.divide(dots, den, out=np.zeros_like(dots), where=den > 0)


class ExpertMapStore:
    """Stored expert maps ``[n, L, J]`` (float32) and semantic embeddings ``[n, h]``."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int, distance: int) -> None:
        if capacity < 1:
            raise ValueError(f"store_capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.L, self.J, self.d = num_layers, num_experts, distance
        self.n = 0
        self.maps = np.zeros((capacity, num_layers, num_experts), dtype=np.float32)
        # the same maps in float64, layer-major (``by_layer[l, :n]`` contiguous): what the matching
        # reads every layer, without converting ``maps`` again each time (written only by insert;
        # grown as maps are stored, up to ``capacity``)
        self.by_layer = np.zeros((num_layers, min(capacity, 64), num_experts))
        self.sem: np.ndarray | None = None
        self.prefix_sq = np.zeros((capacity, num_layers))   # cumulative squared norms of the layers
        self.replaced = 0

    def _ensure(self, h: int) -> None:
        if self.sem is None:
            self.sem = np.zeros((self.capacity, h), dtype=np.float32)
        elif self.sem.shape[1] != h:
            raise ValueError(f"embedding of length {h}; the store holds length {self.sem.shape[1]}")

    def redundancy(self, sem: np.ndarray, emap: np.ndarray) -> np.ndarray:
        """``RDY`` of the new (``sem``, ``emap``) against every stored map."""
        assert self.sem is not None
        cs = _cos(self.sem[: self.n].astype(np.float64), np.asarray(sem, dtype=np.float64))
        cm = _cos(self.maps[: self.n].reshape(self.n, -1).astype(np.float64),
                  np.asarray(emap, dtype=np.float64).reshape(-1))
        return (self.d / self.L) * cs + ((self.L - self.d) / self.L) * cm

    def insert(self, sem: np.ndarray, emap: np.ndarray) -> int:
        """Store a map (``[L, J]``) with its embedding; returns its slot."""
        sem = np.asarray(sem, dtype=np.float32).reshape(-1)
        self._ensure(len(sem))
        assert self.sem is not None
        row = np.asarray(emap, dtype=np.float32)
        sq = np.cumsum((row.astype(np.float64) ** 2).sum(axis=1))
        if self.n < self.capacity:
            slot = self.n
            self.n += 1
        else:
            slot = int(np.argmax(self.redundancy(sem, row)))
            self.replaced += 1
        self.maps[slot], self.sem[slot], self.prefix_sq[slot] = row, sem, sq
        if slot >= self.by_layer.shape[1]:
            grown = np.zeros((self.L, min(self.capacity, 2 * self.by_layer.shape[1]), self.J))
            grown[:, : self.by_layer.shape[1]] = self.by_layer
            self.by_layer = grown
        self.by_layer[:, slot] = row
        return slot

    def layer_row(self, slot: int, layer: int) -> np.ndarray:
        """Stored map ``slot``'s probabilities at ``layer`` in float64 (a new array)."""
        return self.by_layer[layer, slot].copy()

    def semantic(self, sem: np.ndarray) -> tuple[int, float]:
        """Eq. 4: the stored map of most similar embedding and its cosine (store not empty)."""
        assert self.sem is not None and self.n > 0
        cs = _cos(self.sem[: self.n].astype(np.float64), np.asarray(sem, dtype=np.float64).reshape(-1))
        y = int(np.argmax(cs))
        return y, float(cs[y])

    def layer_dots(self, layer: int, p: np.ndarray) -> np.ndarray:
        """``maps[:, layer] @ p`` for every stored map (one step of a running trajectory dot)."""
        return self.by_layer[layer, : self.n] @ np.asarray(p, dtype=np.float64)

    def trajectory(self, layer: int, dots: np.ndarray, traj_sq: float) -> tuple[int, float]:
        """Eq. 5: the stored map whose layers ``0..layer`` are most similar to the observed ones,
        given their running dot products ``dots`` and the observed squared norm ``traj_sq``."""
        den = np.sqrt(self.prefix_sq[: self.n, layer] * traj_sq)
        cs = np.divide(dots, den, out=np.zeros_like(dots), where=den > 0)
        y = int(np.argmax(cs))
        return y, float(cs[y])
