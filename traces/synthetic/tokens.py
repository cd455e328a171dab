"""The token-identity component of the synthetic generator: the stream of token ids (a Zipf
law with optional runs) and each id's fixed random vector per layer (a counter-based hash,
so an id's vector does not depend on which other ids occur or on the workload)."""

from __future__ import annotations

import math

import numpy as np


def token_stream(rng: np.random.Generator, pos: np.ndarray, vocab_size: int, s: float, repeat: float = 0.0
                 ) -> np.ndarray:
    """Token ids of the tokens at positions ``pos`` (0 starts a request): drawn from a Zipf
    law over ``0 .. vocab_size-1`` (``P(w)`` proportional to ``1 / (w + 1)^s``; id 0 the most
    frequent), except that with probability ``repeat`` a token (not the first of its request)
    repeats the previous one. Repeating keeps the Zipf law as every token's distribution."""
    n = len(pos)
    p = np.arange(1, vocab_size + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    words = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), vocab_size - 1).astype(np.int64)
    if repeat > 0.0 and n:
        fresh = (rng.random(n) >= repeat) | (pos == 0)
        src = np.maximum.accumulate(np.where(fresh, np.arange(n), 0))
        words = words[src]
    return words


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashed_normals(key: int, ids: np.ndarray, layer: int, dim: int) -> np.ndarray:
    """``[len(ids), dim]`` float32 standard normals that are a fixed function of ``(key, id,
    layer, column)`` (a counter-based hash, Box-Muller): a token's vector does not depend on
    which other tokens occur, so the workload never changes the model."""
    with np.errstate(over="ignore"):
        base = _mix64(np.uint64(key) ^ _mix64(ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                                               + np.uint64(layer + 1) * np.uint64(0xD6E8FEB86659FD93)))
        ctr = np.arange(2 * dim, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        bits = _mix64(base[:, None] + ctr[None, :]) & _M64
    uni = ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # in (0, 1]
    r = np.sqrt(-2.0 * np.log(uni[:, :dim]))
    return (r * np.cos(2.0 * math.pi * uni[:, dim:])).astype(np.float32)
