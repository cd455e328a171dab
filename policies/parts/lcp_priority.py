"""LCP bookkeeping, MoEpic's Least Cache Priority (Yan et al., "Accelerating Mixture-of-Expert
Inference with Adaptive Expert Split Mechanism", section 3.3, Eq. 4).

Every expert ``E_ij`` of layer ``i`` carries two indicators, updated with every token:

* ``mu_ij``, its activation frequency: the accumulated count of tokens that activated it
  (over the whole run; it is not forgotten when the expert leaves the cache);
* ``nu_ij``, its activation interval: how many consecutive tokens, up to now, have not
  activated it.

Its cache priority is (Eq. 4)::

    P_ij = mu_ij * rho ** (nu_ij / omega)

with the observation window ``omega`` (128) and the balance ``rho`` in (0, 1) (0.25). ``mu``
alone is LFU over the history and the decay in ``nu`` brings in recency; ``rho = 1`` is history
LFU. Pure numpy, no engine.
"""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import UnitKey


class CachePriority:
    """LCP indicators of every (layer, expert); no engine dependency.

    Time is counted in tokens per layer: ``clock[i]`` tokens have passed layer ``i``. An
    iteration of ``n`` tokens (a prefill) is observed as ``n`` consecutive tokens, in order.
    """

    def __init__(self, num_layers: int, num_experts: int, *, rho: float = 0.25,
                 omega: float = 128.0) -> None:
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if omega <= 0:
            raise ValueError(f"omega must be > 0, got {omega}")
        self.rho = rho
        self.omega = omega
        self.mu = np.zeros((num_layers, num_experts), dtype=np.float64)
        self.last = np.full((num_layers, num_experts), -1, dtype=np.int64)   # token of last activation
        self.clock = np.zeros(num_layers, dtype=np.int64)
        # rho ** (1 / omega) once: priority = mu * decay ** nu
        self._log_decay = float(np.log(rho)) / omega

    def observe(self, layer: int, experts: np.ndarray) -> None:
        """Tokens ``experts`` (``[n_tokens, k]``, -1 = nothing) passed ``layer``, in order."""
        ex = np.asarray(experts)
        n = ex.shape[0]
        base = int(self.clock[layer])
        if n == 1:
            row = ex[0]
            row = row[row >= 0]
            self.mu[layer, row] += 1.0
            self.last[layer, row] = base
        else:
            tok = np.broadcast_to(np.arange(n)[:, None], ex.shape).reshape(-1)
            flat = ex.reshape(-1)
            ok = flat >= 0
            np.add.at(self.mu[layer], flat[ok], 1.0)
            np.maximum.at(self.last[layer], flat[ok], base + tok[ok])
        self.clock[layer] = base + n

    def interval(self, layer: int) -> np.ndarray:
        """``nu`` of every expert of ``layer``: tokens since its last activation (the clock,
        for one never activated)."""
        return self.clock[layer] - 1 - self.last[layer]

    def priorities(self, layer: int) -> np.ndarray:
        """``P_ij = mu_ij * rho ** (nu_ij / omega)`` of every expert of ``layer`` (Eq. 4)."""
        return self.mu[layer] * np.exp(self._log_decay * self.interval(layer))

    def ranking(self, layer: int) -> np.ndarray:
        """Experts of ``layer`` from highest to lowest priority (ties: more recent activation,
        then lower id). The first ``C`` are the cache of size ``C`` that LCP converges to."""
        prio = self.priorities(layer)
        ids = np.arange(prio.shape[0])
        return np.lexsort((ids, -self.last[layer], -prio))

    def victim(self, candidates: list[UnitKey]) -> UnitKey:
        """The candidate of least priority (ties: least recent activation, then lower id)."""
        layer = candidates[0][0]
        if all(k[0] == layer for k in candidates):
            prio = self.priorities(layer)
            last = self.last[layer]
            return min(candidates, key=lambda k: (prio[k[1]], last[k[1]], k[1], k[2]))
        pr = {lay: self.priorities(lay) for lay in {k[0] for k in candidates}}
        return min(candidates, key=lambda k: (pr[k[0]][k[1]], self.last[k[0], k[1]], k[0], k[1], k[2]))
