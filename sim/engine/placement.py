"""The run's starting cache (``cache.initial``) and the replayed access counts, shared by the
simulator's engine and the real executor so that both start from the same placement.

First the policy's ``preload`` (what its system loads with the model: GPU-resident layers,
popular experts), which must fit; then ``cache.initial``: ``empty`` places nothing more;
``popular`` fills each pool with the most accessed experts of the offline frequency (the
profile split's, or the replayed trace's); ``random`` with a random order of the run's own
random stream, while its pool (and, for a single global pool, the layer's running share of
it) has room. An expert split into parts (``part_fractions``) is placed part-major: the first
part of every expert in that order, then the second, ... A split policy caches first parts
(MoEpic: the top segments of ``V_i / theta_i`` experts; section 3.4.2 starts from a random
cache of them) and streams the later ones, so the fill gives it as many cached experts as its
room holds; one part per expert (every other policy) is the same fill either way.
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
    rows0 = workload.token_rows()   # joined once per workload, not once per run
    for layer in range(L):
        ex = trace.experts[rows0 + layer].reshape(-1)
        freq[layer] = np.bincount(ex.astype(np.int64), minlength=E)
    return freq


def initial_fill(run: RunState[Any], on_place: Callable[[UnitKey], object] | None = None) -> list[UnitKey]:
    """Place the policy's preloaded units and ``run.initial``'s as resident in ``run.vram`` (the
    simulator's run or the executor's); ``on_place`` is called with each placed key (the
    executor copies the weights in). Returns the placed keys in placement order."""
    vram = run.vram
    placed = _preload(run, on_place)
    if run.initial == "empty":
        return placed
    L, E = run.L, run.E
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
        for p in range(len(run.fractions[layer])):
            nbytes = run.part_bytes(layer, p)
            for e in order:
                key = (layer, int(e), p)
                if key in vram.units:
                    continue
                if vram.used[pool] + nbytes > min(vram.capacity[pool], share):
                    break
                _place(run, key, pool, nbytes, on_place)
                placed.append(key)
    return placed


def _place(run: Any, key: UnitKey, pool: int, nbytes: int, on_place: Callable[[UnitKey], object] | None) -> None:
    u = Unit(key, nbytes, pool, True)
    u.state = RESIDENT
    u.used = True
    run.vram.take_room(u, allow_buffer=False)
    run.vram.add(u)
    if on_place is not None:
        on_place(key)


def _preload(run: RunState[Any], on_place: Callable[[UnitKey], object] | None) -> list[UnitKey]:
    """Place the policy's ``preload`` units; one that does not fit its pool is one line."""
    policy = run.policy
    placed: list[UnitKey] = []
    vram = run.vram
    for key in policy.preload(run.ctx):
        layer, expert, part = (int(x) for x in key)
        if not (0 <= layer < run.L and 0 <= expert < run.E and 0 <= part < len(run.fractions[layer])):
            raise MoesimError(f"policy {policy.name!r} preloads {key}, which the model does not have")
        if (layer, expert, part) in vram.units:
            continue
        pool = run.pool_of(layer)
        nbytes = run.part_bytes(layer, part)
        if vram.used[pool] + nbytes > vram.capacity[pool]:
            raise MoesimError(f"policy {policy.name!r} preloads more than the expert budget holds (pool "
                              f"{pool}: {vram.capacity[pool]} bytes); raise the cache budget")
        _place(run, (layer, expert, part), pool, nbytes, on_place)
        placed.append((layer, expert, part))
    return placed
