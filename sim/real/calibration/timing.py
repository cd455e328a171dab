"""Clocks and fits for the calibration benchmarks.

:func:`measure` times a function with the device's own clock discipline (a CUDA synchronise
before reading the host clock on a GPU) and returns the median of ``repeat`` runs after
``warmup`` untimed ones (the median, because a shared CI machine has outliers). :func:`fit_line`
is ordinary least squares ``y = a + b x``; :func:`fit_anchored` a line through the first point
(decode's one token) with the least-squares slope of the rest (prefill's many).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def sync(device: Any) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def measure(fn: Callable[[], Any], device: Any, *, repeat: int = 7, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b x``; ``a`` and ``b`` clipped at 0 (a time and a
    per-unit cost cannot be negative; a negative fit means the term is below the noise)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return max(0.0, float(y.mean())), 0.0
    b, a = np.polyfit(x, y, 1)
    if a < 0:  # refit through the origin
        return 0.0, max(0.0, float((x @ y) / (x @ x)))
    if b < 0:
        return max(0.0, float(y.mean())), 0.0
    return float(a), float(b)


def fit_anchored(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a + b x`` through the first point exactly (the case a run meets most:
    one token in decode), ``b`` the least-squares slope of the others about it, clipped at 0."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    dx, dy = x[1:] - x[0], y[1:] - y[0]
    b = float(dx @ dy / (dx @ dx)) if len(dx) and (dx @ dx) > 0 else 0.0
    b = max(0.0, b)
    return float(y[0] - b * x[0]), b


def best_of(rounds: Sequence[Sequence[dict[str, Any]]], keys: Sequence[str], values: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of the first round, each ``values`` field replaced by its lowest over the rounds of
    the row with the same ``keys``. A shared machine only ever adds time: slow spells last
    longer than one point's repeats, so rounds spread over time and the best of them is the
    machine undisturbed."""
    out = []
    for row in rounds[0]:
        key = tuple(row[k] for k in keys)
        same = [r for rnd in rounds for r in rnd if tuple(r[k] for k in keys) == key]
        out.append(dict(row, **{v: min(float(r[v]) for r in same) for v in values}))
    return out
