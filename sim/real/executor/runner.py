"""The executor's loop: a workload of a moe-trace replayed on a real model, teacher-forced (each
MoE block runs the trace's experts, so hit rates compare with the simulator's), under a policy
called through the same hooks in the same order as :mod:`moesim.sim.engine.event_loop` (the order is
stated in :mod:`moesim.policies.contract.base`).

Per iteration (batch 1: a request's prefill, or one decode token): ``on_iteration_start``; the
model's forward pass, in which, per MoE layer, a pre-hook calls ``before_layer``, the decoder
layer computes attention and the router, then :meth:`Executor.moe` asks ``on_routed`` for the
plan, classifies each planned expert (hit / late / miss as seen at that instant), issues demand
copies (victims from ``choose_victim``, the simulator's own VRAM accounting), calls
``on_access`` and ``after_layer`` (prefetches become copies), computes the experts as their
copies land (ready ones first; one at a time in a fixed order while demand loads wait for room:
:func:`moesim.sim.engine.plans.next_in_fixed_order`), and calls ``on_layer_end``; then ``on_iteration_end``.
Copies run on the copy engine (:mod:`.copier`) through the run's residency (:mod:`.residency`,
the state's ``transfers``); unit states change only on the main thread, when the executor looks
(so every policy callback runs on the main thread). The run's state is the simulator's
:class:`~moesim.sim.engine.state.RunState`, its view the simulator's
:class:`~moesim.sim.engine.view.EngineView` with the wall clock.

What it shares with the simulator's step (:mod:`moesim.sim.engine.step`): the run's state, the
view, the plan order (:func:`~moesim.sim.engine.plans.next_in_fixed_order`) and the hook order.
It does not call the step's functions: its time is the wall clock and its copies are real, so
a layer's state changes only when it looks (``res.refresh()`` before classifying and in the
compute loop), its waiting demand loads live in the residency (not the simulator's transfers),
its counters are :class:`~.stats.ExecStats`, and it replays whole experts at batch 1 without
CPU slots' timing or lossy accounting, which the step's functions all include.

Two host paths run as real systems run them. A policy or runtime that copies from pageable
memory (``host_memory = "pageable"``: accelerate) gets an unpinned host pool and synchronous
copies on the compute stream (``tensor.to(device)``: the host waits for the queued kernels and
the driver's staged copy); the layer waits for the plan's ``wait_for`` copies before it ends.
A plan's CPU experts (``Plan.on_cpu``: llama.cpp's CPU layers, Fiddler's misses) run on the
host's cores at ``threads`` torch threads with the host pool's weights: the activations are
copied to the host before any GPU expert is queued, the host computes once the ready GPU experts
are queued (so both run at once, as the simulator's host queue and GPU do), and their sum is
added to the layer's output on the device.

Set-up follows the simulator's order (required columns, frequencies, ``setup``,
``cache.initial``, ``warm``), then untimed warm-up and per-request context, then every
iteration of the workload timed on the wall clock between ``on_iteration_start`` and the end of
the forward pass (the simulator's iteration end).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import torch

from moesim.policies.contract.base import (
    HIT,
    LATE,
    MISS,
    RESIDENT,
    Outcome,
    Plan,
    Policy,
    Profile,
    Routing,
    check_columns,
)
from moesim.sim.core.lib_warnings import quiet_library_warnings
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.placement import initial_fill, replayed_frequency
from moesim.sim.engine.plans import next_in_fixed_order
from moesim.sim.engine.records import record_request_starts
from moesim.sim.engine.state import RunState
from moesim.sim.engine.view import EngineView
from moesim.sim.engine.vram import Unit
from moesim.sim.engine.workload import Workload
from moesim.sim.real.executor.copier import make_copier
from moesim.sim.real.executor.kernels import apply_expert
from moesim.sim.real.executor.model import OffloadModel
from moesim.sim.real.executor.plan import access_order as _access_order
from moesim.sim.real.executor.plan import combine_weights as _combine_weights
from moesim.sim.real.executor.residency import ExecutorError, Residency
from moesim.sim.real.executor.stats import ExecStats, exec_metrics
from moesim.sim.real.executor.store import ExpertStore, pageable_pool

__all__ = ["Executor", "ExecutorError"]


class Executor:
    """Replays ``workload`` on ``om`` under ``policy``. Build, then :meth:`run`; the run's state
    is :attr:`state`, its counters :attr:`stats`."""

    def __init__(self, workload: Workload, policy: Policy, om: OffloadModel, cost: CostModel, *,
                 budget_bytes: int, buffer_bytes: int = 0, initial: str = "empty",
                 pcie_order: str = "priority", seed: int = 0, profile: Profile | None = None,
                 copy: str = "auto", threads: int = 1) -> None:
        m = workload.trace.model
        if any(len(it.request_ids) > 1 and it.phase == 1 for it in workload.iterations):
            raise ExecutorError("the executor replays batch_size 1 only")
        if (m.num_layers, m.num_experts, m.top_k) != (om.spec.num_layers, om.spec.num_experts, om.spec.top_k):
            raise ExecutorError(f"model {om.spec.name!r} has {om.spec.num_layers} MoE layers x {om.spec.num_experts} "
                                f"experts, top-{om.spec.top_k}; the trace has {m.num_layers} x {m.num_experts}, top-{m.top_k}")
        if policy.scope not in ("layer", "global"):
            raise ExecutorError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        self.om = om
        self.threads = threads
        self.t_origin = time.perf_counter()
        self.stats = ExecStats()
        state: RunState[Residency] = RunState.build(
            workload, policy, cost, budget_bytes=budget_bytes, buffer_bytes=buffer_bytes,
            initial=initial, seed=seed, profile=profile, stats=self.stats, model=om.spec,
            clock=lambda: time.perf_counter() - self.t_origin, record_steps=False)
        state.view = EngineView(state)
        eb = om.spec.expert_bytes
        slots = int(budget_bytes) // eb + int(buffer_bytes) // eb
        # a policy or runtime that copies from pageable memory (accelerate's offload) keeps its
        # pool unpinned and copies synchronously on the compute stream, as `tensor.to(device)`
        # does: the host waits for the kernels queued before and for the staged copy itself
        self.pageable = "pageable" in (policy.host_memory, cost.runtime.host_memory)
        host = om.host_experts
        if self.pageable:
            if copy not in ("auto", "sync"):
                raise ExecutorError(f"policy {policy.name!r} copies from pageable memory, synchronously; "
                                    f"copy mode {copy!r} is not how such copies run (use auto or sync)")
            copy, host = "sync", pageable_pool(host)
        self.res = Residency(state, self.stats, ExpertStore(host, om.device, slots),
                             make_copier(om.device, copy, pcie_order))
        state.transfers = self.res
        self.state = state
        self.mode = "bypass"
        self._bypass_routing: np.ndarray | None = None

    def _charge(self) -> None:
        """Policy CPU time charged through ``spend_cpu``/``decision_us`` is spent for real (a busy
        wait), so both sides run the same policy cost."""
        s = self.state
        if s.spent_s > 0:
            end = time.perf_counter() + s.spent_s
            self.stats.policy_cpu_s += s.spent_s
            s.spent_s = 0.0
            while time.perf_counter() < end:
                pass

    # ------------------------------------------------------------------------------------------
    # the model's callbacks (Driver)
    def before_layer(self, layer: int) -> None:
        """Pre-hook of the decoder layer holding MoE layer ``layer``."""
        if self.mode != "offload":
            return
        s = self.state
        s.cur_layer = layer
        self.res.refresh()
        s.policy.before_layer(s.view, layer)
        self._charge()

    def moe(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The MoE output of ``layer``: teacher-forced routing, the policy's plan, real copies."""
        if self.mode != "offload":
            return self._moe_direct(layer, x, logits)
        s, res = self.state, self.res
        it = s.cur_iter
        policy, view, vram, st = s.policy, s.view, s.vram, self.stats
        s.routed_upto = layer
        routing = s.routing_of(it, layer)
        plan = policy.on_routed(view, layer, routing)
        plan_m, on_cpu = self._check_plan(plan, routing, layer)
        s.spent_s += float(policy.decision_us) * 1e-6
        self._charge()
        weights = _combine_weights(logits, plan_m)
        gmask = plan_m >= 0 if on_cpu is None else (plan_m >= 0) & ~on_cpu
        exps, rows = _access_order(plan_m, gmask, x.device)
        res.refresh()
        units = vram.units
        for e in exps:
            vram.pinned.add((layer, e, 0))
        status: list[int] = []
        need: list[tuple[int, Unit]] = []
        pool = s.pool_of(layer)
        for e in exps:
            key = (layer, e, 0)
            u = units.get(key)
            if u is None:
                u = Unit(key, s.expert_bytes, pool, True)
                vram.add(u)
                res.waiting.append(u)
                status.append(MISS)
                st.misses += 1
            elif u.state == RESIDENT:
                status.append(HIT)
                st.hits += 1
            else:
                status.append(LATE)
                st.late += 1
            if not u.used:
                st.fetch_needed += 1
                if not u.demand:
                    st.fetch_covered += 1
                    st.prefetch_used += 1
                u.used = True
            need.append((e, u))
        t_wait = time.perf_counter()
        if res.waiting:
            res.issue_demand()
        cpu_exps, cpu_rows = ([], {}) if on_cpu is None else _access_order(plan_m, (plan_m >= 0) & on_cpu)
        outcome = Outcome(layer, routing, plan_m, exps, status, cpu_exps)
        policy.on_access(view, layer, outcome)
        policy.after_layer(view, layer, outcome)
        self._charge()
        out = torch.zeros_like(x)
        store = res.store
        waits = [] if plan is None else [u for e in plan.wait_for if (u := units.get((layer, e, 0))) is not None]
        # CPU experts read the activations on the host, taken before any GPU expert is queued (the
        # copy waits for the compute stream), and run once the ready GPU experts are queued
        host_in = self._to_host(x, weights) if cpu_exps else None
        remaining = need
        early = {id(x_) for x_, c in zip(need, status, strict=True) if c != MISS}
        stall = time.perf_counter() - t_wait
        while remaining:
            res.refresh()
            if res.waiting:
                head = next_in_fixed_order(remaining, early)
                watch = [head]
                ready = [head] if head[1].state == RESIDENT else []
            else:
                watch = remaining
                ready = [x_ for x_ in remaining if x_[1].state == RESIDENT]
            if ready:
                for e, u in ready:
                    tok, slot = rows[e]
                    self._apply(out, x, weights, tok, slot, store.weights(u.key))
                    vram.pinned.discard(u.key)
                    if u.in_buffer:
                        res.settle(u)
                done = {id(r) for r in ready}
                remaining = [r for r in remaining if id(r) not in done]
                if res.waiting:
                    res.issue_demand()
            if host_in is not None:   # the host's turn: after the ready GPU experts, before any wait
                self._cpu_experts(out, host_in, cpu_rows, layer, cpu_exps)
                host_in = None
                continue
            if ready:
                continue
            ts = time.perf_counter()
            pending = [res.jobs[u.key] for _, u in watch if u.key in res.jobs]
            if pending:
                res.copier.wait(pending)
            elif res.waiting:
                res.issue_demand()
                if not any(u.key in res.jobs for _, u in watch):
                    # the room is held by copies already started into the load's pool (a CUDA
                    # stream starts every copy at once and cannot withdraw one): wait for one to
                    # land, when it can be evicted
                    u0 = res.waiting[0]
                    started = [j for k, j in res.jobs.items()
                               if k in vram.units and vram.units[k].pool == u0.pool and res.copier.started(j)]
                    if not started:
                        raise ExecutorError(f"the expert budget is too small: layer {layer} needs expert {u0.key[1]} "
                                            f"but policy {policy.name!r} can evict nothing; raise cache.rate")
                    res.copier.wait(started)
            stall += time.perf_counter() - ts
        if host_in is not None:   # no GPU expert in the plan
            self._cpu_experts(out, host_in, cpu_rows, layer, cpu_exps)
        ts = time.perf_counter()
        for u in waits:   # copies the plan waits for (whole expert tensors, plan.wait_for)
            res.refresh()
            job = res.jobs.get(u.key)
            if u.state != RESIDENT and units.get(u.key) is u and job is not None:
                res.copier.wait([job])
        if waits:
            res.refresh()   # the last awaited copy is resident before on_layer_end may evict it
        stall += time.perf_counter() - ts
        vram.pinned.clear()
        st.stall_s += stall
        if vram.buffer_used:
            for key, u in list(vram.units.items()):
                if u.in_buffer and u.state == RESIDENT and key[0] == layer:
                    res.settle(u)
        policy.on_layer_end(view, layer)
        self._charge()
        return out

    def _to_host(self, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's activations and combination weights where the CPU experts read them: the
        host (on a GPU, a device-to-host copy that waits for the compute stream)."""
        return x.to("cpu"), weights.to("cpu")

    def _cpu_experts(self, out: torch.Tensor, host_in: tuple[torch.Tensor, torch.Tensor],
                     rows: dict[int, tuple[torch.Tensor, torch.Tensor]], layer: int, cpu_exps: list[int]) -> None:
        """Run the plan's CPU experts (``rows``: each one's tokens and slots, on the host) on the
        host's cores (``threads`` torch threads) with the host pool's weights, one after another,
        and add their output into ``out`` (on a GPU, one host-to-device copy of the sum)."""
        xh, wh = host_in
        oh = torch.zeros_like(xh)
        store = self.res.store
        for e in cpu_exps:
            tok, slot = rows[e]
            self._apply(oh, xh, wh, tok, slot, store.source(layer, e))
        self.stats.cpu_accesses += len(cpu_exps)
        out.add_(oh.to(out.device))

    def _apply(self, out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, tok: torch.Tensor,
               slot: torch.Tensor, flat: torch.Tensor) -> None:
        apply_expert(out, x, weights, tok, slot, flat, self.om.hidden, self.om.inter)

    def _moe_direct(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Untimed context (a prompt not replayed, warm-up): the trace's routing when given, else
        the model's own top-k; experts straight from the host pool."""
        if self._bypass_routing is not None:
            plan_m = self._bypass_routing[:, layer, :].astype(np.int64)
        else:
            plan_m = torch.topk(logits, self.state.K, dim=-1).indices.cpu().numpy()
        weights = _combine_weights(logits, plan_m)
        out = torch.zeros_like(x)
        exps, rows = _access_order(plan_m, plan_m >= 0, x.device)
        for e in exps:
            tok, slot = rows[e]
            self._apply(out, x, weights, tok, slot, self.res.store.source(layer, e).to(x.device))
        return out

    def _check_plan(self, plan: Plan | None, routing: Routing, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
        if plan is None:
            return np.asarray(routing.experts, dtype=np.int64), None
        s = self.state
        ex = np.asarray(plan.experts, dtype=np.int64)
        where = f"iteration {s.cur_iter.index}, layer {layer}"
        if ex.shape[0] != routing.n_tokens or (ex.size and (ex.min() < -1 or ex.max() >= s.E)):
            raise ExecutorError(f"policy {s.policy.name!r} made an invalid plan at {where}")
        if not s.policy.lossy and not np.array_equal(ex, routing.experts):
            raise ExecutorError(f"policy {s.policy.name!r} is not lossy but planned other experts at {where}")
        return ex, None if plan.on_cpu is None else np.asarray(plan.on_cpu, dtype=bool)

    # ------------------------------------------------------------------------------------------
    def _token_ids(self, rows0: np.ndarray) -> torch.Tensor:
        tr = self.state.trace
        tid = tr.token_id
        if tid is not None:
            ids = np.asarray(tid[rows0], dtype=np.int64) % self.om.vocab_size
        else:  # no token ids in the trace: a fixed pseudo-random text (timing does not depend on it)
            ids = (tr.request_id[rows0] * 7919 + tr.token_idx[rows0] * 104729 + 17) % self.om.vocab_size
        return torch.as_tensor(ids, dtype=torch.long, device=self.om.device).view(1, -1)

    def _forward(self, rows0: np.ndarray, cache: Any) -> None:
        with torch.inference_mode():
            self.om.model(input_ids=self._token_ids(rows0), past_key_values=cache, use_cache=True,
                          logits_to_keep=1)
        if self.om.device.type == "cuda":
            torch.cuda.synchronize(self.om.device)

    def _context(self, request: int, upto_row: int) -> Any:
        """A fresh KV cache holding the request's tokens before ``upto_row`` that the workload
        does not replay (its prompt when only decode is replayed), computed untimed."""
        from transformers import DynamicCache

        cache = DynamicCache()
        tr = self.state.trace
        L = self.state.L
        rows0 = np.arange(0, tr.num_rows, L)
        mine = rows0[(tr.request_id[rows0] == request) & (rows0 < upto_row)]
        if len(mine):
            self._bypass_routing = np.stack([tr.experts[mine + layer] for layer in range(L)], axis=1)
            self.mode = "bypass"
            self._forward(mine, cache)
            self._bypass_routing = None
        return cache

    # ------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        """The policy's set-up, in the simulator's order up to the initial fill."""
        s = self.state
        policy = s.policy
        check_columns(policy, s.ctx.columns, s.trace.model.name)
        s.ctx.replayed_frequency = replayed_frequency(s.workload, s.trace, s.L, s.E)
        policy.setup(s.ctx)
        for layer in range(s.L):
            if tuple(policy.part_fractions(layer)) != (1.0,):
                raise ExecutorError(f"policy {policy.name!r} splits experts into parts; the executor "
                                    "copies whole experts only")
        if min(s.vram.capacity) + s.vram.buffer_capacity < s.expert_bytes:
            per = min(s.vram.capacity) / s.expert_bytes
            raise ExecutorError(f"the expert budget holds {per:.2f} experts per pool; at least one is "
                                "needed (raise cache.rate or cache.buffer_experts)")

    def _warmup(self, n: int) -> None:
        """Untimed forwards (allocator, kernel selection, first-call costs), experts from the host."""
        it = self.state.workload.iterations[0]
        for _ in range(n):
            cache = self._context(int(it.request_ids[0]), int(it.rows0[0]))
            self.mode = "bypass"
            self._forward(it.rows0, cache)

    @quiet_library_warnings()
    def run(self, warmup: int = 2) -> ExecStats:
        """Replay the workload; returns the counters and wall-clock times (``self.stats``)."""
        s, res, st = self.state, self.res, self.stats
        policy, view = s.policy, s.view
        self._setup()
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)   # the host's share: CPU experts (and the model itself on a CPU)
        self.om.attach(self)
        iters = s.workload.iterations
        last_of: dict[int, int] = {}
        for it in iters:
            last_of[int(it.request_ids[0])] = it.index
        collecting = gc.isenabled()
        try:
            self._warmup(warmup)
            store = res.store
            placed = initial_fill(s, lambda key: store.alloc(key).copy_(store.source(key[0], key[1])))
            policy.warm(view, placed)
            # no cyclic garbage collection while timed (as timeit): its passes land at random points
            # and are not part of what the simulator models
            gc.collect()
            gc.disable()
            self.t_origin = time.perf_counter()
            caches: dict[int, object] = {}
            batch_start: dict[int, float] = {}
            for it in iters:
                r = int(it.request_ids[0])
                if r not in caches:
                    caches[r] = self._context(r, int(it.rows0[0]))
                self.mode = "offload"
                s.cur_iter, s.cur_layer, s.routed_upto = it, -1, -1
                record_request_starts(st.request_start, it, view.now, batch_start)
                t0 = view.now
                policy.on_iteration_start(view)
                self._charge()
                self._forward(it.rows0, caches[r])
                t1 = view.now
                st.iteration_s.append(t1 - t0)
                st.token_end.setdefault(r, []).append(t1)
                s.cur_layer = s.L
                policy.on_iteration_end(view)
                self._charge()
                s.prev_iter = it
                if last_of[r] == it.index:
                    del caches[r]
            res.refresh()
            st.wall_s = view.now
        finally:
            if collecting:
                gc.enable()
            self.mode = "bypass"
            res.copier.close()
            torch.set_num_threads(threads)
        return st

    def metrics(self) -> dict[str, Any]:
        """The run's metrics, with the simulator's definitions (:mod:`moesim.sim.run.metrics`)."""
        copier = self.res.copier
        return exec_metrics(self.state, self.stats, copy_busy_s=copier.busy_s(), copy_engine=copier.name,
                            device=str(self.om.device))
