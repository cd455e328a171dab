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
Copies run on the copy engine (:mod:`.copier`); unit states change only on the main thread,
when the executor looks (so every policy callback runs on the main thread).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from moesim.policies.contract.base import (
    ABSENT,
    HIT,
    INFLIGHT,
    LATE,
    MISS,
    OPTIONAL_COLUMNS,
    QUEUED,
    RESIDENT,
    Context,
    Decline,
    EvictionRequest,
    Outcome,
    Plan,
    Policy,
    Profile,
    Reason,
    Routing,
    UnitKey,
)
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.plans import next_in_fixed_order
from moesim.sim.engine.vram import Unit, Vram
from moesim.sim.engine.workload import Iteration, Workload
from moesim.sim.real.executor.copier import DEMAND, PREFETCH, make_copier
from moesim.sim.real.executor.kernels import apply_expert
from moesim.sim.real.executor.model import OffloadModel
from moesim.sim.real.executor.plan import access_order as _access_order
from moesim.sim.real.executor.plan import combine_weights as _combine_weights
from moesim.sim.real.executor.stats import ExecStats, exec_metrics
from moesim.sim.real.executor.store import ExpertStore
from moesim.sim.real.executor.view import ExecutorView


class ExecutorError(MoesimError, ValueError):
    """A run the executor cannot do (batching, swap-out, expert segments) or a policy that broke
    the contract; one line."""


class Executor:
    """Replays ``workload`` on ``om`` under ``policy``. Build, then :meth:`run`."""

    def __init__(self, workload: Workload, policy: Policy, om: OffloadModel, cost: CostModel, *,
                 budget_bytes: int, buffer_bytes: int = 0, initial: str = "empty",
                 pcie_order: str = "priority", seed: int = 0, profile: Profile | None = None,
                 copy: str = "auto", threads: int = 1) -> None:
        tr = workload.trace
        m = tr.model
        if any(len(it.request_ids) > 1 and it.phase == 1 for it in workload.iterations):
            raise ExecutorError("the executor replays batch_size 1 only")
        if (m.num_layers, m.num_experts, m.top_k) != (om.spec.num_layers, om.spec.num_experts, om.spec.top_k):
            raise ExecutorError(f"model {om.spec.name!r} has {om.spec.num_layers} MoE layers x {om.spec.num_experts} "
                                f"experts, top-{om.spec.top_k}; the trace has {m.num_layers} x {m.num_experts}, top-{m.top_k}")
        self.workload, self.trace, self.policy, self.om, self.cost = workload, tr, policy, om, cost
        self.L, self.E, self.K = m.num_layers, m.num_experts, m.top_k
        self.expert_bytes = om.spec.expert_bytes
        self.threads = threads
        self.view = ExecutorView(self)
        self.transfers = self   # where the view's actions go: the executor issues its copies itself
        self.initial = initial
        pol_seed, eng_seed = np.random.SeedSequence(seed).spawn(2)
        self.rng = np.random.default_rng(eng_seed)
        if policy.scope not in ("layer", "global"):
            raise ExecutorError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        self.global_pool = policy.scope == "global"
        caps = [int(budget_bytes)] if self.global_pool else [int(budget_bytes) // self.L] * self.L
        self.vram = Vram(caps, buffer_bytes)
        self.fractions: list[tuple[float, ...]] = [(1.0,)] * self.L
        slots = int(budget_bytes) // self.expert_bytes + int(buffer_bytes) // self.expert_bytes
        self.store = ExpertStore(om.host_experts, om.device, slots)
        self.copier = make_copier(om.device, copy, pcie_order)
        self.jobs: dict[UnitKey, Any] = {}
        self.waiting: list[Unit] = []
        self.stats = ExecStats()
        self.spent_s = 0.0
        self.t_origin = time.perf_counter()
        self.cur_layer = -1
        self.routed_upto = -1
        self.cur_iter: Iteration = workload.iterations[0]
        self.prev_iter: Iteration | None = None
        self.mode = "bypass"
        self.emb_index = ({int(r): i for i, r in enumerate(tr.embedding_rows)}
                          if tr.embedding_rows is not None else None)
        columns = frozenset(c for c in OPTIONAL_COLUMNS if getattr(tr, c, None) is not None)
        self.ctx = Context(
            model=om.spec, hardware=cost.hardware, cost=cost, num_layers=self.L, num_experts=self.E,
            top_k=self.K, expert_bytes=self.expert_bytes, pool_capacity=list(caps),
            buffer_bytes=self.vram.buffer_capacity, total_budget=sum(caps),
            rng=np.random.default_rng(pol_seed), columns=columns, profile=profile,
            future=workload.future() if policy.oracle else None)
        self._bypass_routing: np.ndarray | None = None

    # ------------------------------------------------------------------------------------------
    # the view's questions
    def pool_of(self, layer: int) -> int:
        """The pool of ``layer``'s units."""
        return 0 if self.global_pool else layer

    def part_bytes(self, layer: int, part: int) -> int:
        """Bytes of an expert (the executor runs whole experts: one part)."""
        if part != 0:
            raise ValueError(f"layer {layer} has 1 part; no part {part}")
        return self.expert_bytes

    @staticmethod
    def rows_of(it: Iteration, layer: int) -> np.ndarray:
        """Trace rows of ``layer`` for the tokens of ``it``."""
        return it.rows0 + layer

    def routing_of(self, it: Iteration, layer: int) -> Routing:
        """The recorded routing of ``layer`` for ``it``."""
        rows = self.rows_of(it, layer)
        w = self.trace.weights
        return Routing(layer, self.trace.experts[rows], None if w is None else w[rows])

    # ------------------------------------------------------------------------------------------
    # residency: landing copies, eviction, room
    def _refresh(self) -> None:
        """Bring unit states up to date with the copy engine (main thread only)."""
        if not self.jobs:
            return
        st = self.stats
        for key, job in list(self.jobs.items()):
            u = self.vram.units.get(key)
            if u is None:
                del self.jobs[key]
                continue
            if u.state == QUEUED and self.copier.started(job):
                u.state = INFLIGHT
                st.count_start(u)
            if self.copier.done(job):
                if u.state == QUEUED:
                    st.count_start(u)
                u.state = RESIDENT
                del self.jobs[key]
                self.policy.on_loaded(self.view, key, u.demand)

    def _drop(self, u: Unit) -> None:
        self.vram.remove(u)
        self.vram.release(u)
        self.store.free(u.key)
        if not u.used and not u.demand:
            self.stats.wasted_prefetch_bytes += u.nbytes
        self.policy.on_evict(self.view, u.key)

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        u = self.vram.units.get(key)
        if u is None or u.state != RESIDENT or key in self.vram.pinned:
            return False
        self.stats.evictions += 1
        self._drop(u)
        return True

    def _make_room(self, pool: int, nbytes: int, reason: Reason, key: UnitKey) -> bool:
        vram, policy = self.vram, self.policy
        while vram.free(pool) < nbytes:
            cands = vram.candidates(pool)
            if not cands:
                break
            req = EvictionRequest(reason, key, pool, nbytes - vram.free(pool), cands)
            victim = policy.choose_victim(self.view, req)
            if isinstance(victim, Decline):
                if victim is not req.decline:
                    raise ExecutorError(f"policy {policy.name!r} answered {victim.value!r} to a {reason.value} "
                                        f"eviction request; expected a victim or {req.decline.value!r}")
                break
            if not self.evict_key(victim):
                raise ExecutorError(f"policy {policy.name!r} chose victim {victim}, which is not an unpinned resident")
        return vram.free(pool) >= nbytes

    def _submit(self, u: Unit, cls: int, priority: float = 0.0) -> None:
        layer, expert, _ = u.key
        dst = self.store.alloc(u.key)
        u.state = QUEUED
        self.jobs[u.key] = self.copier.submit(u.key, self.store.source(layer, expert), dst, cls, priority)

    def issue_prefetch(self, key: UnitKey, priority: float, into_buffer: bool) -> bool:
        """A policy's prefetch: room now (victims from the policy), then a queued copy."""
        vram = self.vram
        if key in vram.units:
            return False
        layer, expert, part = key
        if not (0 <= layer < self.L and 0 <= expert < self.E) or part != 0:
            raise ExecutorError(f"policy {self.policy.name!r} prefetched {key}; the model has {self.L} layers x "
                                f"{self.E} experts of one part")
        pool = self.pool_of(layer)
        if any(w.pool == pool for w in self.waiting):
            return False
        u = Unit(key, self.expert_bytes, pool, False)
        if into_buffer:
            if not vram.take_buffer(u):
                return False
        else:
            self._make_room(pool, u.nbytes, Reason.PREFETCH, key)
            if not vram.take_room(u, True):
                return False
        vram.add(u)
        self._submit(u, PREFETCH, priority)
        return True

    def reprioritize(self, key: UnitKey, priority: float) -> bool:
        """Change a queued prefetch's priority."""
        job = self.jobs.get(key)
        u = self.vram.units.get(key)
        if job is None or u is None or u.demand:
            return False
        return bool(self.copier.reprioritize(job, priority))

    def cancel_queued(self, layer: int | None, pool: int | None = None) -> int:
        """Withdraw queued prefetches (of ``layer``, or holding room in ``pool``, or all)."""
        dropped = []
        for key, job in list(self.jobs.items()):
            u = self.vram.units.get(key)
            if u is None or u.demand or key in self.vram.pinned or u.state != QUEUED:
                continue
            if layer is not None and key[0] != layer:
                continue
            if pool is not None and (u.pool != pool or u.in_buffer):
                continue
            if self.copier.cancel(job):
                del self.jobs[key]
                u.state = ABSENT
                self.vram.remove(u)
                self.vram.release(u)
                self.store.free(key)
                dropped.append(key)
        for key in dropped:
            self.policy.on_cancel(self.view, key)
        return len(dropped)

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the budget among layers (bytes per layer), usage fitting."""
        if self.global_pool or len(budgets) != self.L:
            raise ExecutorError(f"policy {self.policy.name!r}: need {self.L} layer budgets of a per-layer pool")
        if sum(int(b) for b in budgets) > sum(self.ctx.pool_capacity):
            raise ExecutorError(f"layer budgets sum to {sum(budgets)} bytes, over the total")
        for layer, b in enumerate(budgets):
            if self.vram.used[layer] > int(b):
                raise ExecutorError(f"layer {layer} uses {self.vram.used[layer]} bytes, over its new budget {int(b)}")
        self.vram.set_capacities([int(b) for b in budgets])

    def _issue_demand(self) -> None:
        """Give room to waiting demand units in order and queue their copies."""
        while self.waiting:
            u = self.waiting[0]
            ok = self._make_room(u.pool, u.nbytes, Reason.DEMAND, u.key) and self.vram.take_room(u, True)
            if not ok and self.cancel_queued(None, pool=u.pool):
                ok = self._make_room(u.pool, u.nbytes, Reason.DEMAND, u.key) and self.vram.take_room(u, True)
            if not ok:
                break
            self.waiting.pop(0)
            self._submit(u, DEMAND)

    def _charge(self) -> None:
        """Policy CPU time charged through ``spend_cpu``/``decision_us`` is spent for real (a busy
        wait), so both sides run the same policy cost."""
        if self.spent_s > 0:
            end = time.perf_counter() + self.spent_s
            self.stats.policy_cpu_s += self.spent_s
            self.spent_s = 0.0
            while time.perf_counter() < end:
                pass

    # ------------------------------------------------------------------------------------------
    # the model's callbacks (Driver)
    def before_layer(self, layer: int) -> None:
        """Pre-hook of the decoder layer holding MoE layer ``layer``."""
        if self.mode != "offload":
            return
        self.cur_layer = layer
        self._refresh()
        self.policy.before_layer(self.view, layer)
        self._charge()

    def moe(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The MoE output of ``layer``: teacher-forced routing, the policy's plan, real copies."""
        if self.mode != "offload":
            return self._moe_direct(layer, x, logits)
        it = self.cur_iter
        policy, view, vram, st = self.policy, self.view, self.vram, self.stats
        self.routed_upto = layer
        routing = self.routing_of(it, layer)
        plan = policy.on_routed(view, layer, routing)
        plan_m, on_cpu = self._check_plan(plan, routing, layer)
        self.spent_s += float(policy.decision_us) * 1e-6
        self._charge()
        weights = _combine_weights(logits, plan_m)
        gmask = plan_m >= 0 if on_cpu is None else (plan_m >= 0) & ~on_cpu
        exps, rows = _access_order(plan_m, gmask)
        self._refresh()
        units = vram.units
        for e in exps:
            vram.pinned.add((layer, e, 0))
        status: list[int] = []
        need: list[tuple[int, Unit]] = []
        pool = self.pool_of(layer)
        for e in exps:
            key = (layer, e, 0)
            u = units.get(key)
            if u is None:
                u = Unit(key, self.expert_bytes, pool, True)
                vram.add(u)
                self.waiting.append(u)
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
        if self.waiting:
            self._issue_demand()
        cpu_exps = [] if on_cpu is None else _access_order(plan_m, (plan_m >= 0) & on_cpu)[0]
        outcome = Outcome(layer, routing, plan_m, exps, status, cpu_exps)
        policy.on_access(view, layer, outcome)
        policy.after_layer(view, layer, outcome)
        self._charge()
        out = torch.zeros_like(x)
        if cpu_exps:
            crow = _access_order(plan_m, (plan_m >= 0) & on_cpu)[1]  # type: ignore[operator]
            for e in cpu_exps:
                tok, slot = crow[e]
                self._apply(out, x, weights, tok, slot, self.store.source(layer, e).to(x.device))
                st.cpu_accesses += 1
        remaining = need
        early = {id(x_) for x_, s in zip(need, status, strict=True) if s != MISS}
        stall = time.perf_counter() - t_wait
        while remaining:
            self._refresh()
            if self.waiting:
                head = next_in_fixed_order(remaining, early)
                watch = [head]
                ready = [head] if head[1].state == RESIDENT else []
            else:
                watch = remaining
                ready = [x_ for x_ in remaining if x_[1].state == RESIDENT]
            if ready:
                for e, u in ready:
                    tok, slot = rows[e]
                    self._apply(out, x, weights, tok, slot, self.store.weights(u.key))
                    vram.pinned.discard(u.key)
                    if u.in_buffer:
                        self._settle(u)
                done = {id(r) for r in ready}
                remaining = [r for r in remaining if id(r) not in done]
                if self.waiting:
                    self._issue_demand()
                continue
            ts = time.perf_counter()
            pending = [self.jobs[u.key] for _, u in watch if u.key in self.jobs]
            if pending:
                self.copier.wait(pending)
            elif self.waiting:
                self._issue_demand()
                if not any(u.key in self.jobs for _, u in watch):
                    u0 = self.waiting[0]
                    raise ExecutorError(f"the expert budget is too small: layer {layer} needs expert {u0.key[1]} "
                                        f"but policy {policy.name!r} can evict nothing; raise cache.rate")
            stall += time.perf_counter() - ts
        vram.pinned.clear()
        st.stall_s += stall
        if vram.buffer_used:
            for key, u in list(vram.units.items()):
                if u.in_buffer and u.state == RESIDENT and key[0] == layer:
                    self._settle(u)
        policy.on_layer_end(view, layer)
        self._charge()
        return out

    def _apply(self, out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, tok: torch.Tensor,
               slot: torch.Tensor, flat: torch.Tensor) -> None:
        apply_expert(out, x, weights, tok, slot, flat, self.om.hidden, self.om.inter)

    def _settle(self, u: Unit) -> None:
        if self.policy.admit(self.view, u.key) and self._make_room(u.pool, u.nbytes, Reason.ADMIT, u.key):
            self.vram.move_to_pool(u)
        else:
            self._drop(u)

    def _moe_direct(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Untimed context (a prompt not replayed, warm-up): the trace's routing when given, else
        the model's own top-k; experts straight from the host pool."""
        if self._bypass_routing is not None:
            plan_m = self._bypass_routing[:, layer, :].astype(np.int64)
        else:
            plan_m = torch.topk(logits, self.K, dim=-1).indices.cpu().numpy()
        weights = _combine_weights(logits, plan_m)
        out = torch.zeros_like(x)
        exps, rows = _access_order(plan_m, plan_m >= 0)
        for e in exps:
            tok, slot = rows[e]
            self._apply(out, x, weights, tok, slot, self.store.source(layer, e).to(x.device))
        return out

    def _check_plan(self, plan: Plan | None, routing: Routing, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
        if plan is None:
            return np.asarray(routing.experts, dtype=np.int64), None
        ex = np.asarray(plan.experts, dtype=np.int64)
        where = f"iteration {self.cur_iter.index}, layer {layer}"
        if ex.shape[0] != routing.n_tokens or (ex.size and (ex.min() < -1 or ex.max() >= self.E)):
            raise ExecutorError(f"policy {self.policy.name!r} made an invalid plan at {where}")
        if not self.policy.lossy and not np.array_equal(ex, routing.experts):
            raise ExecutorError(f"policy {self.policy.name!r} is not lossy but planned other experts at {where}")
        return ex, None if plan.on_cpu is None else np.asarray(plan.on_cpu, dtype=bool)

    # ------------------------------------------------------------------------------------------
    def _token_ids(self, rows0: np.ndarray) -> torch.Tensor:
        tid = self.trace.token_id
        if tid is not None:
            ids = np.asarray(tid[rows0], dtype=np.int64) % self.om.vocab_size
        else:  # no token ids in the trace: a fixed pseudo-random text (timing does not depend on it)
            ids = (self.trace.request_id[rows0] * 7919 + self.trace.token_idx[rows0] * 104729 + 17) % self.om.vocab_size
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
        tr = self.trace
        L = self.L
        rows0 = np.arange(0, tr.num_rows, L)
        mine = rows0[(tr.request_id[rows0] == request) & (rows0 < upto_row)]
        if len(mine):
            self._bypass_routing = np.stack([tr.experts[mine + layer] for layer in range(L)], axis=1)
            self.mode = "bypass"
            self._forward(mine, cache)
            self._bypass_routing = None
        return cache

    # ------------------------------------------------------------------------------------------
    def run(self, warmup: int = 2) -> ExecStats:
        """Replay the workload; returns the counters and wall-clock times (``self.stats``)."""
        from moesim.sim.real.executor.replay import replay

        return replay(self, warmup)

    def metrics(self) -> dict[str, Any]:
        """The run's metrics, with the simulator's definitions (:mod:`moesim.sim.run.metrics`)."""
        return exec_metrics(self)
