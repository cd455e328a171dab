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

_min = np.minimum.reduce   # what ndarray.min reduces with


def select_by_mass(p: np.ndarray | list[float], delta: float, k: int, dynamic: bool = True
                   ) -> list[tuple[int, float]]:
    """``(expert, probability)`` of the smallest prefix of ``p`` in descending order whose mass
    is at least ``delta`` and which holds at least ``k`` experts (only ``k`` without
    ``dynamic``); experts of probability 0 are never added beyond ``k``."""
    if isinstance(p, np.ndarray) and p.dtype != np.float64:   # its own float type: numpy's sums
        return _select_by_mass_np(p, delta, k, dynamic)
    return select_floats(p.tolist() if isinstance(p, np.ndarray) else [float(v) for v in p], delta, k, dynamic)


def select_floats(vals: list[float], delta: float, k: int, dynamic: bool = True) -> list[tuple[int, float]]:
    """:func:`select_by_mass` of probabilities given as a list of Python floats (not changed)."""
    tot = sum(vals)
    if tot != tot:   # a NaN among them (or infinities of both signs): numpy's order (NaN last), below
        return _select_by_mass_np(np.asarray(vals), delta, k, dynamic)
    # plain Python on the few probabilities of one layer, the same result as below: a stable
    # descending sort (ties by expert id), the running sum in the same order of additions
    order = sorted(range(len(vals)), key=vals.__getitem__, reverse=True)
    n = k
    if dynamic:
        nonzero = len(vals) - vals.count(0.0)
        need = nonzero
        thr = delta - 1e-9
        csum = 0.0
        for i, e in enumerate(order):
            csum = csum + vals[e] if i else vals[e]
            if csum >= thr:
                need = i + 1
                break
        n = max(k, min(need, nonzero))
    return [(e, vals[e]) for e in order[:n]]


def _select_by_mass_np(p: np.ndarray, delta: float, k: int, dynamic: bool) -> list[tuple[int, float]]:
    """:func:`select_by_mass` in numpy (for probabilities with a NaN)."""
    order = np.argsort(-p, kind="stable")
    n = k
    if dynamic:
        csum = np.cumsum(p[order])
        reach = np.nonzero(csum >= delta - 1e-9)[0]
        need = int(reach[0]) + 1 if len(reach) else int(np.count_nonzero(p))
        n = max(k, min(need, int(np.count_nonzero(p))))
    n = min(n, len(p))
    return [(int(e), float(p[e])) for e in order[:n]]


def _cos(a: np.ndarray, b: np.ndarray, na: np.ndarray | None = None) -> np.ndarray:
    """Cosine of each row of ``a`` with ``b`` (0 where a norm is 0); ``na``: the rows' norms
    (``np.linalg.norm(a, axis=1)``), when known."""
    if na is None:
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
        # float64 copies of the stored maps (flat, slot-major) and embeddings, with each row's
        # norm (``np.linalg.norm(rows, axis=1)``: a row's norm does not depend on the rows beside
        # it): what the cosines of ``redundancy`` and ``semantic`` read, converted once per map
        # (written only by insert; grown as maps are stored, up to ``capacity``)
        self._flat = np.zeros((min(capacity, 64), num_layers * num_experts))
        self._flat_norm = np.zeros(capacity)
        self._sem64: np.ndarray | None = None
        self._sem_norm = np.zeros(capacity)
        self.prefix_sq = np.zeros((capacity, num_layers))   # cumulative squared norms of the layers
        # the same norms layer-major (``_prefix_t[l, :n]`` contiguous): what ``trajectory`` reads
        # every layer (written only by insert, with ``prefix_sq``)
        self._prefix_t = np.zeros((num_layers, capacity))
        # per layer, the least of the stored maps' norms (``_prefix_t[l, :n].min()``, NaN if one
        # is NaN), as Python floats: tells ``trajectory`` whether a norm can be zero
        self._prefix_min: list[float] = [0.0] * num_layers
        self.replaced = 0
        self.version = 0   # stored maps written so far (a slot's content changes only then)

    def _ensure(self, h: int) -> None:
        if self.sem is None:
            self.sem = np.zeros((self.capacity, h), dtype=np.float32)
            self._sem64 = np.zeros((min(self.capacity, 64), h))
        elif self.sem.shape[1] != h:
            raise ValueError(f"embedding of length {h}; the store holds length {self.sem.shape[1]}")

    def redundancy(self, sem: np.ndarray, emap: np.ndarray) -> np.ndarray:
        """``RDY`` of the new (``sem``, ``emap``) against every stored map."""
        assert self._sem64 is not None
        n = self.n
        cs = _cos(self._sem64[:n], np.asarray(sem, dtype=np.float64), self._sem_norm[:n])
        cm = _cos(self._flat[:n], np.asarray(emap, dtype=np.float64).reshape(-1), self._flat_norm[:n])
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
        self._prefix_t[:, slot] = sq
        self._prefix_min = _min(self._prefix_t[:, : self.n], axis=1).tolist()
        if slot >= self.by_layer.shape[1]:
            grown = np.zeros((self.L, min(self.capacity, 2 * self.by_layer.shape[1]), self.J))
            grown[:, : self.by_layer.shape[1]] = self.by_layer
            self.by_layer = grown
        self.by_layer[:, slot] = row
        self._flat, flat = self._grown(self._flat, slot), self.maps[slot].reshape(1, -1).astype(np.float64)
        self._flat[slot] = flat[0]
        self._flat_norm[slot] = np.linalg.norm(flat, axis=1)[0]
        assert self._sem64 is not None
        self._sem64, s64 = self._grown(self._sem64, slot), self.sem[slot: slot + 1].astype(np.float64)
        self._sem64[slot] = s64[0]
        self._sem_norm[slot] = np.linalg.norm(s64, axis=1)[0]
        self.version += 1
        return slot

    def _grown(self, rows: np.ndarray, slot: int) -> np.ndarray:
        """``rows`` (one per slot), with room for ``slot`` (doubled, up to ``capacity``)."""
        if slot < rows.shape[0]:
            return rows
        grown = np.zeros((min(self.capacity, max(2 * rows.shape[0], slot + 1)), rows.shape[1]))
        grown[: rows.shape[0]] = rows
        return grown

    def layer_row(self, slot: int, layer: int) -> np.ndarray:
        """Stored map ``slot``'s probabilities at ``layer`` in float64 (a new array)."""
        return self.by_layer[layer, slot].copy()

    def layer_list(self, slot: int, layer: int) -> list[float]:
        """:meth:`layer_row` as Python floats."""
        return self.by_layer[layer, slot].tolist()

    def semantic(self, sem: np.ndarray) -> tuple[int, float]:
        """Eq. 4: the stored map of most similar embedding and its cosine (store not empty)."""
        assert self._sem64 is not None and self.n > 0
        n = self.n
        cs = _cos(self._sem64[:n], np.asarray(sem, dtype=np.float64).reshape(-1), self._sem_norm[:n])
        y = int(np.argmax(cs))
        return y, float(cs[y])

    def layer_dots(self, layer: int, p: np.ndarray) -> np.ndarray:
        """``maps[:, layer] @ p`` for every stored map (one step of a running trajectory dot)."""
        return self.by_layer[layer, : self.n] @ np.asarray(p, dtype=np.float64)

    def trajectory(self, layer: int, dots: np.ndarray, traj_sq: float) -> tuple[int, float]:
        """Eq. 5: the stored map whose layers ``0..layer`` are most similar to the observed ones,
        given their running dot products ``dots`` and the observed squared norm ``traj_sq``."""
        den = self._prefix_t[layer, : self.n] * traj_sq
        np.sqrt(den, out=den)
        # no zero (nor NaN) norm: the plain quotient is the one below. Each ``den`` is
        # ``sqrt(prefix * traj_sq)``, and a product with ``traj_sq`` is monotone in ``prefix``
        # (rounding included), so the least of them is ``sqrt(least prefix * traj_sq)``: positive
        # exactly when ``den.min() > 0`` is (NaN either way when a norm is NaN)
        if self._prefix_min[layer] * traj_sq > 0:
            cs = np.divide(dots, den, out=den)
        else:
            cs = np.divide(dots, den, out=np.zeros_like(dots), where=den > 0)
        y = int(cs.argmax())
        return y, cs.item(y)
