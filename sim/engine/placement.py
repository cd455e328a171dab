"""The run's starting cache (``cache.initial``) and the replayed access counts, shared by the
simulator's engine and the real executor so that both start from the same placement.

``empty`` places nothing; ``popular`` fills each pool with the most accessed experts of the
offline frequency (the profile split's, or the replayed trace's); ``random`` with a random
order of the run's own random stream. Each expert is placed part by part while its pool (and,
for a single global pool, the layer's running share of it) has room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import RESIDENT, UnitKey
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.vram import Unit

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState


def replayed_frequency(workload: Any, trace: Any, L: int, E: int) -> np.ndarray:
    """``[L, E]`` access counts over the iterations of ``workload``."""
    freq = np.zeros((L, E), dtype=np.int64)
    rows0 = np.concatenate([it.rows0 for it in workload.iterations])
    for layer in range(L):
        ex = trace.experts[rows0 + layer].reshape(-1)
        freq[layer] = np.bincount(ex.astype(np.int64), minlength=E)
    return freq


def initial_fill(run: RunState[Any], on_place: Callable[[UnitKey], object] | None = None) -> list[UnitKey]:
    """Place ``run.initial``'s units as resident in ``run.vram`` (the simulator's run or the
    executor's); ``on_place`` is called with each placed key (the executor copies the weights
    in). Returns the placed keys in placement order."""
    if run.initial == "empty":
        return []
    L, E = run.L, run.E
    vram = run.vram
    placed: list[UnitKey] = []
    freq = run.ctx.offline_frequency() if run.initial == "popular" else None
    for layer in range(L):
        if freq is not None:
            order = np.argsort(-freq[layer], kind="stable")
        elif run.initial == "random":
            order = run.rng.permutation(E)
        else:
            raise MoesimError(f"cache.initial: unknown value {run.initial!r} (empty, popular or random)")
        pool = run.pool_of(layer)
        share = vram.capacity[pool] if not run.global_pool else vram.capacity[0] // L * (layer + 1)
        for e in order:
            for p in range(len(run.fractions[layer])):
                key = (layer, int(e), p)
                nbytes = run.part_bytes(layer, p)
                if vram.used[pool] + nbytes > min(vram.capacity[pool], share):
                    break
                u = Unit(key, nbytes, pool, True)
                u.state = RESIDENT
                u.used = True
                vram.take_room(u, allow_buffer=False)
                vram.add(u)
                placed.append(key)
                if on_place is not None:
                    on_place(key)
    return placed
