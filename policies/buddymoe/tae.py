"""Top-k Adjusted Entropy (TAE), BuddyMoE's per-token gate (Wang et al., PPoPP 2026, section 3.1).

Eq. (1): ``TAE(x) = -sum_{i in S(x)} p~_i log p~_i / log k`` with ``p~`` the router
probabilities renormalised over the token's top-k set ``S(x)`` (with temperature ``T``: section
3.1 (ii)). TAE lies in [0, 1]: 0 when one expert holds all the mass (a peaky, confident token:
never substitute), 1 when the k experts are equally likely. The gate forbids substitution when
``TAE <= tau``; ``tau`` per layer may be calibrated as the ``p``-th percentile of the profile's
TAE values (section 3.1 (iii), ``p`` in [10, 20] in the paper).
"""

from __future__ import annotations

import math

import numpy as np

from moesim.policies.buddymoe.coactivation import renormalised


def tae(weights: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Eq. (1) of each row of ``weights`` ``[..., k]`` (router probabilities of the top-k set):
    a value in [0, 1] per row; 0 for ``k = 1``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    p = renormalised(weights, temperature)
    k = p.shape[-1]
    if k < 2:
        return np.zeros(p.shape[:-1])
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return np.clip(-(p * logp).sum(axis=-1) / np.log(k), 0.0, 1.0)


def surely_positive(row: list[float]) -> bool:
    """Whether :func:`tae` of one token's weights ``row`` (at temperature 1) is certainly above 0,
    without computing it: at least two weights are positive, all are finite, and the smallest
    positive one is far from vanishing beside their sum (ratio above 1e-200, sum below 1e300).
    Then some renormalised ``p`` lies strictly inside (0, 1), its ``p log p`` is negative and far
    from underflow, so the entropy, and the TAE, are positive. False says nothing either way."""
    pos = 0
    tot = 0.0
    low = math.inf
    for v in row:
        if not math.isfinite(v):
            return False
        if v > 0:
            pos += 1
            tot += v
            if v < low:
                low = v
    return pos >= 2 and tot < 1e300 and low > 1e-200 * tot


def calibrate_tau(weights: np.ndarray, percentile: float, temperature: float = 1.0) -> np.ndarray:
    """Per-layer thresholds ``tau_l``: the ``percentile``-th percentile (0-100) of the TAE of
    every profiling token at layer ``l``; ``weights`` is ``[T, L, k]``."""
    if not 0 <= percentile <= 100:
        raise ValueError(f"tau_percentile must lie in [0, 100], got {percentile}")
    values = tae(weights, temperature)                # [T, L]
    return np.percentile(values, percentile, axis=0)
