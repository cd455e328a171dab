"""The executor's outer loop: set-up in the simulator's order (required columns, frequencies,
``setup``, ``cache.initial``, ``warm``), untimed warm-up and per-request context, then every
iteration of the workload timed on the wall clock between ``on_iteration_start`` and the end
of the forward pass (the simulator's iteration end)."""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from moesim.policies.contract.base import check_columns
from moesim.sim.engine.placement import initial_fill, replayed_frequency
from moesim.sim.engine.records import record_request_starts

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.real.executor.runner import Executor
    from moesim.sim.real.executor.stats import ExecStats


def _setup(ex: Executor) -> None:
    from moesim.sim.real.executor.runner import ExecutorError

    policy = ex.policy
    check_columns(policy, ex.ctx.columns, ex.trace.model.name)
    if policy.host_memory != "pinned":
        raise ExecutorError(f"policy {policy.name!r} copies from {policy.host_memory} host memory; the "
                            "executor copies from pinned memory only")
    ex.ctx.replayed_frequency = replayed_frequency(ex.workload, ex.trace, ex.L, ex.E)
    policy.setup(ex.ctx)
    for layer in range(ex.L):
        if tuple(policy.part_fractions(layer)) != (1.0,):
            raise ExecutorError(f"policy {policy.name!r} splits experts into parts; the executor "
                                "copies whole experts only")
    if min(ex.vram.capacity) + ex.vram.buffer_capacity < ex.expert_bytes:
        per = min(ex.vram.capacity) / ex.expert_bytes
        raise ExecutorError(f"the expert budget holds {per:.2f} experts per pool; at least one is "
                            "needed (raise cache.rate or cache.buffer_experts)")


def _warmup(ex: Executor, n: int) -> None:
    """Untimed forwards (allocator, kernel selection, first-call costs), experts from the host."""
    it = ex.workload.iterations[0]
    for _ in range(n):
        cache = ex._context(int(it.request_ids[0]), int(it.rows0[0]))
        ex.mode = "bypass"
        ex._forward(it.rows0, cache)


def replay(ex: Executor, warmup: int) -> ExecStats:
    """Run every iteration of ``ex.workload``; returns ``ex.stats``."""
    policy, view, st = ex.policy, ex.view, ex.stats
    _setup(ex)
    threads = torch.get_num_threads()
    if ex.om.device.type == "cpu":
        torch.set_num_threads(ex.threads)
    ex.om.attach(ex)
    iters = ex.workload.iterations
    last_of: dict[int, int] = {}
    for it in iters:
        last_of[int(it.request_ids[0])] = it.index
    collecting = gc.isenabled()
    try:
        _warmup(ex, warmup)
        placed = initial_fill(ex, lambda key: ex.store.alloc(key).copy_(ex.store.source(key[0], key[1])))
        policy.warm(view, placed)
        # no cyclic garbage collection while timed (as timeit): its passes land at random points
        # and are not part of what the simulator models
        gc.collect()
        gc.disable()
        ex.t_origin = time.perf_counter()
        caches: dict[int, object] = {}
        batch_start: dict[int, float] = {}
        for it in iters:
            r = int(it.request_ids[0])
            if r not in caches:
                caches[r] = ex._context(r, int(it.rows0[0]))
            ex.mode = "offload"
            ex.cur_iter, ex.cur_layer, ex.routed_upto = it, -1, -1
            record_request_starts(st.request_start, it, view.now, batch_start)
            t0 = view.now
            policy.on_iteration_start(view)
            ex._charge()
            ex._forward(it.rows0, caches[r])
            t1 = view.now
            st.iteration_s.append(t1 - t0)
            st.token_end.setdefault(r, []).append(t1)
            ex.cur_layer = ex.L
            policy.on_iteration_end(view)
            ex._charge()
            ex.prev_iter = it
            if last_of[r] == it.index:
                del caches[r]
        ex._refresh()
        st.wall_s = view.now
    finally:
        if collecting:
            gc.enable()
        ex.mode = "bypass"
        ex.copier.close()
        torch.set_num_threads(threads)
    return st


def iteration_times(st: ExecStats) -> np.ndarray:
    """Wall-clock seconds of each timed iteration."""
    return np.asarray(st.iteration_s, dtype=np.float64)
