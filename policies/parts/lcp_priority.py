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

from collections.abc import Sequence

import numpy as np

from moesim.policies.contract.base import UnitKey


class CachePriority:
    """LCP indicators of every (layer, expert); no engine dependency.

    Time is counted in tokens per layer: ``clock[i]`` tokens have passed layer ``i``. An
    iteration of ``n`` tokens (a prefill) is observed as ``n`` consecutive tokens, in order.

    The indicators are kept in Python lists (a layer holds a handful of experts, so per-token
    numpy calls would cost more than the work); ``rho ** (nu / omega)`` is read from a table of
    the values ``np.exp`` gives for every interval, so every priority is the float64 product
    that Eq. 4 computed on arrays gives, bit for bit.
    """

    def __init__(self, num_layers: int, num_experts: int, *, rho: float = 0.25,
                 omega: float = 128.0) -> None:
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if omega <= 0:
            raise ValueError(f"omega must be > 0, got {omega}")
        self.rho = rho
        self.omega = omega
        self._mu = [[0.0] * num_experts for _ in range(num_layers)]
        self._last = [[-1] * num_experts for _ in range(num_layers)]   # token of last activation
        self._clock = [0] * num_layers
        # rho ** (1 / omega) once: priority = mu * decay ** nu
        self._log_decay = float(np.log(rho)) / omega
        self._decay: list[float] = []   # _decay[nu] = exp(_log_decay * nu), grown on demand

    @property
    def mu(self) -> np.ndarray:
        """``[layers, experts]`` activation counts (a copy)."""
        return np.array(self._mu, dtype=np.float64)

    @property
    def last(self) -> np.ndarray:
        """``[layers, experts]`` token of each expert's last activation, -1 for none (a copy)."""
        return np.array(self._last, dtype=np.int64)

    @property
    def clock(self) -> np.ndarray:
        """Tokens that have passed each layer (a copy)."""
        return np.array(self._clock, dtype=np.int64)

    def _grow(self, nu: int) -> list[float]:
        """The decay table, long enough to hold interval ``nu``: ``np.exp`` of the intervals as
        a contiguous int64 array times the log decay, the very array operation of Eq. 4."""
        old = len(self._decay)
        new = max(nu + 1, 2 * old, 1024)
        self._decay.extend(np.exp(self._log_decay * np.arange(old, new, dtype=np.int64)).tolist())
        return self._decay

    def observe(self, layer: int, experts: np.ndarray | list[list[int]]) -> None:
        """Tokens ``experts`` (``[n_tokens, k]``, -1 = nothing) passed ``layer``, in order."""
        rows = experts.tolist() if isinstance(experts, np.ndarray) else experts
        mu, last = self._mu[layer], self._last[layer]
        base = self._clock[layer]
        if len(rows) == 1:
            for e in rows[0]:
                if e >= 0 and last[e] != base:   # an expert twice in a token counts once
                    mu[e] += 1.0
                    last[e] = base
        else:
            for t, row in enumerate(rows, base):   # every occurrence counts
                for e in row:
                    if e >= 0:
                        mu[e] += 1.0
                        last[e] = t
        self._clock[layer] = base + len(rows)

    def interval(self, layer: int) -> np.ndarray:
        """``nu`` of every expert of ``layer``: tokens since its last activation (the clock,
        for one never activated)."""
        now = self._clock[layer] - 1
        return np.array([now - t for t in self._last[layer]], dtype=np.int64)

    def priority_list(self, layer: int) -> list[float]:
        """``P_ij = mu_ij * rho ** (nu_ij / omega)`` of every expert of ``layer`` (Eq. 4), as
        Python floats."""
        now = self._clock[layer] - 1
        decay = self._decay
        if now + 1 >= len(decay):   # nu is at most the clock
            decay = self._grow(now + 1)
        return [m * decay[now - t] for m, t in zip(self._mu[layer], self._last[layer], strict=True)]

    def priorities(self, layer: int) -> np.ndarray:
        """``P_ij = mu_ij * rho ** (nu_ij / omega)`` of every expert of ``layer`` (Eq. 4)."""
        return np.array(self.priority_list(layer), dtype=np.float64)

    def ranking_list(self, layer: int) -> list[int]:
        """Experts of ``layer`` from highest to lowest priority (ties: more recent activation,
        then lower id). The first ``C`` are the cache of size ``C`` that LCP converges to."""
        now = self._clock[layer] - 1
        decay = self._decay
        if now + 1 >= len(decay):   # nu is at most the clock
            decay = self._grow(now + 1)
        last = self._last[layer]
        # priority_list, inlined (once per layer)
        prio = [m * decay[now - t] for m, t in zip(self._mu[layer], last, strict=True)]
        if len(set(prio)) == len(prio):   # distinct priorities decide alone
            return sorted(range(len(prio)), key=prio.__getitem__, reverse=True)
        # descending (priority, last activation, -id) is ascending (-priority, -last, id); the
        # keys are distinct, so the order is total
        keys = sorted(zip(prio, last, range(0, -len(prio), -1), strict=True), reverse=True)
        return [-k[2] for k in keys]

    def ranking(self, layer: int) -> np.ndarray:
        """:meth:`ranking_list` as an array."""
        return np.array(self.ranking_list(layer), dtype=np.intp)

    def victim(self, candidates: Sequence[UnitKey]) -> UnitKey:
        """The candidate of least priority (ties: least recent activation, then lower layer, id
        and part)."""
        clock, mus, lasts = self._clock, self._mu, self._last
        decay = self._decay
        best: UnitKey | None = None
        best_p, best_t = 0.0, 0   # (priority, last activation) of ``best``; the ties compare the rest
        for k in candidates:
            layer, e = k[0], k[1]
            t = lasts[layer][e]
            nu = clock[layer] - 1 - t
            if nu >= len(decay):
                decay = self._grow(nu)
            p = mus[layer][e] * decay[nu]
            # the least (priority, last, layer, id, part), the tuple built only on a tie
            if best is None or p < best_p or (p == best_p and (t, layer, e, k[2]) < (best_t, *best)):
                best, best_p, best_t = k, p, t
        assert best is not None, "victim() needs a candidate"
        return best
