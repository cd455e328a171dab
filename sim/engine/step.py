"""The per-layer step of a run, stated once: what happens in one MoE layer of one iteration, as
named functions over the run's :class:`~moesim.sim.engine.state.RunState`. The loop that calls
them in the contract's order (:mod:`moesim.policies.contract.base`), with the GPU's waits
between them, is written once too, in :mod:`moesim.sim.engine.layer_loop`; the event loop
(:mod:`moesim.sim.engine.gpu`) runs it on SimPy, the SimPy-free driver (:mod:`moesim.sim.fast.driver`)
by arithmetic, and the fast kernels of :mod:`moesim.sim.fast` compute the same instants.
Read that loop for the order; read the functions here for what each step does.

The executor (:mod:`moesim.sim.real.executor.runner`) runs real copies and kernels and keeps its
own classification (see its docstring).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import (
    HIT,
    LATE,
    MISS,
    PARTIAL,
    RESIDENT,
    WAITING,
    Outcome,
    Plan,
    Routing,
)
from moesim.sim.engine.frozen import slot_maker
from moesim.sim.engine.part_order import early_parts
from moesim.sim.engine.plans import access_order, check_plan, count_lossy
from moesim.sim.engine.records import STEP_CHUNK
from moesim.sim.engine.scheduler import Scheduler
from moesim.sim.engine.splits import apply_fractions
from moesim.sim.engine.vram import Unit
from moesim.sim.engine.workload import Iteration
from moesim.traces.format.trace_file import PREFILL

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

new_routing = slot_maker(Routing)   # Routing(layer, experts, weights), once per layer

Need = tuple[int, float, Unit]
"""A part to compute: (index of its expert in the layer's access order, GPU seconds, unit)."""

_NONE: list[int] = []   # no experts (shared, never changed)


class LayerStep:
    """One layer of one iteration in progress: its plan, the experts it runs (access order) with
    their token counts, their outcome, the parts still to compute and the layer's counters."""

    __slots__ = ("layer", "it", "routing", "plan", "plan_m", "exps", "counts", "cpu_exps", "cpu_counts",
                 "status", "need", "miss_units", "hits", "late", "part", "miss", "miss_bytes", "t0",
                 "t_route", "stall", "early")

    def __init__(self, layer: int, it: Iteration, t0: float) -> None:
        self.layer = layer
        self.it = it
        self.routing: Routing | None = None
        self.plan: Plan | None = None
        self.plan_m: np.ndarray | None = None     # the plan's experts (None: as routed)
        # GPU experts in access order and their tokens; CPU ones likewise (route sets them; the
        # shared empty list is never changed)
        self.exps = self.counts = self.cpu_exps = self.cpu_counts = _NONE
        self.status: list[int] = []                # HIT, LATE, PARTIAL or MISS per GPU expert
        self.need: list[Need] = []                 # every part to compute, access order
        self.miss_units: list[Unit] = []           # demand units made for absent parts
        self.hits = self.late = self.part = self.miss = self.miss_bytes = 0
        self.t0 = self.t_route = t0                # the layer's start; when its routing was known
        self.stall = 0.0                           # seconds the GPU waited for copies or room
        self.early: set[int] | None = None         # ids of the parts present when routed (fixed order)


class Stepper:
    """The step functions of one run (see the module docstring), with what they reuse from layer
    to layer: the policy's hooks bound once, which of them it overrides, cost caches."""

    def __init__(self, run: RunState[Transfers]) -> None:
        policy = run.policy
        self.run = run
        self.policy = policy
        self.view = run.view
        self.cost = run.cost
        self.stats = run.stats
        self.vram = run.vram
        self.tx = run.transfers
        self.batch_start: dict[int, float] = {}
        self.exp_cost: dict[int, float] = {}
        self.cpu_cost: dict[int, float] = {}
        self._non_moe: dict[int, float] = {}   # token count -> layer_s
        self._tail: dict[int, tuple[float, float]] = {}      # token count -> (head_s, overhead)
        self._row_it: Iteration | None = None   # the one-token iteration whose first row is _row0
        self._row0 = 0
        # skip calls of hooks a policy does not override (the hot path runs per layer)
        self.has_start = policy.uses_hook("on_iteration_start")
        self.has_before = policy.uses_hook("before_layer")
        self.has_routed = policy.uses_hook("on_routed")
        self.has_access = policy.uses_hook("on_access")
        self.has_after = policy.uses_hook("after_layer")
        self.has_end = policy.uses_hook("on_layer_end")
        self.has_iend = policy.uses_hook("on_iteration_end")
        self.splits = policy.uses_hook("part_fractions")
        self.lossy = policy.lossy
        self.decision_s = float(policy.decision_us) * 1e-6
        self.overhead_layer = run.cost.overhead_layer_s()
        self.overhead_prefill = run.cost.overhead_layer_s(prefill=True)   # more with runtime.eager_prefill
        self.shared_decode = run.cost.overlap_shared_s(1)   # runtime.overlap_shared_experts: one-token passes
        self.shared_prefill = run.cost.overlap_shared_s(1, prefill=True)
        self.cpu_switch = run.cost.cpu_switch_s()
        self.copies = run.cost.runtime.activation_copies is not None   # the hand-off grows with the tokens
        self.eager = run.cost.runtime.eager_score_bytes is not None
        self.kv_switch = run.cost.kv_host_switch_s()   # runtime.kv_on_host: attention's hand-off, every layer
        self.step_rows = run.steps.rows if run.record_steps else None   # appended inline (see StepRecords)
        self.timeline = run.timeline if run.record_timeline else None
        plan = run.workload.serving
        self.sched = run.scheduler = None if plan is None else Scheduler(plan)

    # -- iterations ---------------------------------------------------------------------------
    def iterations(self) -> Iterable[Iteration]:
        """The iterations to replay: the workload's; serving, the scheduler's, each formed when
        the previous one has ended (at the run's clock then)."""
        if self.sched is None:
            return self.run.workload.iterations
        return self.sched.iterate(self.run.now)

    def begin_iteration(self, it: Iteration, now: float) -> float:
        """``it`` starts at ``now``: the run's position, its requests' starts. Returns when its
        first layer starts: ``now``, or serving, the arrival an idle GPU waits for (the driver
        advances its clock there); its requests started at their arrival."""
        run = self.run
        run.cur_iter = it
        self.tx.iteration = it.index
        run.cur_layer = -1
        run.routed_upto = -1
        sched = self.sched
        if sched is None:
            self.stats.start_iteration(it, now, self.batch_start)
            return now
        starts = self.stats.request_start
        arrival = sched.plan.arrival
        for r, first in zip(it.request_ids.tolist(), it.first_of_request.tolist(), strict=True):
            if first:
                starts[r] = float(arrival[r])
        return max(now, sched.start)

    def tail_s(self, it: Iteration) -> tuple[float, float]:
        """After ``it``'s last layer: the LM head's GPU seconds and the runtime's per-iteration
        overhead (the cost model's, kept per token count: they depend on nothing else)."""
        n_tok = it.n_tokens
        got = self._tail.get(n_tok)
        if got is None:
            got = self._tail[n_tok] = (self.cost.head_s(n_tok), self.cost.overhead_iteration_s(n_tok))
        return got

    def count_tail(self, head: float, over: float) -> None:
        """Account the head and the overhead once the GPU ran them."""
        st = self.stats
        st.gpu_busy_s += head
        st.overhead_s += over

    def end_iteration(self, it: Iteration, now: float) -> None:
        """``it`` ends at ``now`` (then the policy's ``on_iteration_end``): its tokens' times
        (serving: of the requests it gave a token; finished ones leave the batch)."""
        if self.sched is None:
            self.stats.end_iteration(it, now)
        else:
            self.stats.iteration_end.append(now)
            self.sched.end_iteration(now, self.stats.token_end)
        self.run.cur_layer = self.run.L

    def close_iteration(self, it: Iteration) -> None:
        """After ``it`` (and its host time): the policy's next part split, progress."""
        run = self.run
        if self.splits:
            apply_fractions(run)
        run.prev_iter = it
        if run.progress is not None:
            if self.sched is None:
                run.progress(it.index + 1, len(run.workload.iterations))
            else:   # serving: requests finished of all
                run.progress(self.sched.finished, self.sched.plan.n)

    # -- a layer ------------------------------------------------------------------------------
    def begin_layer(self, layer: int) -> None:
        """Layer ``layer`` starts: the run's position and the layer's counters."""
        self.run.cur_layer = layer
        tx = self.tx
        tx.layer_evictions = 0
        tx.layer_prefetch_bytes = 0

    def non_moe_s(self, it: Iteration) -> tuple[float, float]:
        """GPU seconds of a layer's non-MoE compute (attention, norms, router) in ``it``, and the
        runtime's per-layer overhead: before each layer's routing is known the GPU runs their
        sum. The same for every layer of ``it`` (the kernels ask once per iteration); without a
        context, the cost model's, kept per token count (it depends on nothing else). With a
        modelled context (``it.kv_tokens`` > 0) attention's reads of the KV cache add
        :meth:`~moesim.sim.engine.cost.CostModel.context_s`; a runtime with eager attention
        (``eager_score_bytes``) charges :meth:`~moesim.sim.engine.cost.CostModel.eager_attention_s`
        instead, with or without a context. A runtime whose attention runs on the host
        (``runtime.kv_on_host``) adds its hand-off,
        :meth:`~moesim.sim.engine.cost.CostModel.kv_host_switch_s`, with or without a context (its
        reads then at the host's rates, in ``context_s``). A prefill's overhead is the runtime's
        eager one when it captures graphs for decode only (``runtime.eager_prefill``)."""
        n_tok = it.n_tokens
        over = self.overhead_prefill if it.phase == PREFILL else self.overhead_layer
        if self.eager:
            return self.cost.layer_s(n_tok) + self.cost.eager_attention_s(n_tok, it.kv_tokens), over
        if it.kv_tokens:
            return self.cost.layer_s(n_tok) + self.cost.context_s(it.kv_tokens, it.attn_pairs) + self.kv_switch, over
        cached = self._non_moe.get(n_tok)
        if cached is None:   # kv_switch is 0.0 unless runtime.kv_on_host: adding it leaves the sum's bits as they are
            cached = self._non_moe[n_tok] = self.cost.layer_s(n_tok) + self.kv_switch
        return cached, over

    def shared_after_route_s(self, it: Iteration) -> float:
        """Seconds of each layer's non-MoE time in ``it`` that are its shared experts run after
        routing, beside the CPU experts (:meth:`~moesim.sim.engine.cost.CostModel.overlap_shared_s`:
        ``runtime.overlap_shared_experts``, a graph-replayed pass of one token); 0 otherwise. Part
        of :meth:`non_moe_s`'s seconds, not added to them."""
        if it.n_tokens != 1:
            return 0.0
        return self.shared_prefill if it.phase == PREFILL else self.shared_decode

    def route(self, it: Iteration, layer: int, t0: float, layer_s: float, over_s: float) -> LayerStep:
        """Routing of ``layer`` (started at ``t0``) becomes known once the GPU ran its non-MoE
        compute (``layer_s`` and the overhead ``over_s``, counted here): the policy's plan
        (``on_routed``, checked), the lossy accounting, the decision time (left in ``spent_s``),
        and the experts that run on the GPU and on the CPU in access order with their tokens."""
        run = self.run
        st = self.stats
        st.gpu_busy_s += layer_s
        st.overhead_s += over_s
        run.routed_upto = layer
        ls = LayerStep(layer, it, t0)
        rows0 = it.rows0
        n_tok = rows0.shape[0]
        tr = run.trace
        # the routing (as RunState.routing_of gives it; a one-row slice view for one token)
        if n_tok == 1:
            if self._row_it is not it:   # the token's first trace row, read once per iteration
                self._row_it, self._row0 = it, int(rows0[0])
            r = self._row0 + layer
            rows: slice | np.ndarray = slice(r, r + 1)
        else:
            rows = rows0 + layer
        w = tr.weights
        routing = ls.routing = new_routing(layer, tr.experts[rows], None if w is None else w[rows])
        plan = self.policy.on_routed(self.view, layer, routing) if self.has_routed else None
        on_cpu = None
        if plan is None:
            plan_m = routing.experts
            if self.lossy:
                count_lossy(self.stats, routing, None)
        else:
            ls.plan = plan
            plan_m = ls.plan_m = check_plan(plan, routing, policy_name=self.policy.name, lossy=self.lossy,
                                            num_experts=run.E, iteration=it.index, layer=layer)
            on_cpu = None if plan.on_cpu is None else np.asarray(plan.on_cpu, dtype=bool)
            if self.lossy:
                count_lossy(self.stats, routing, plan_m)
        if self.decision_s:
            run.spent_s += self.decision_s
        if on_cpu is not None and on_cpu.any():
            ls.cpu_exps, ls.cpu_counts = access_order(plan_m[(plan_m >= 0) & on_cpu])
            ls.exps, ls.counts = access_order(plan_m[(plan_m >= 0) & ~on_cpu])
        elif n_tok == 1:
            exps = plan_m.tolist()[0]   # [1, k]: its one row, without a reshaped view
            if -1 in exps:   # slots a plan dropped (plans hold -1..E-1, the trace 0..E-1)
                exps = [x for x in exps if x >= 0]
            ls.exps = exps
            ls.counts = [1] * len(exps)
        else:   # the trace's experts are all valid (0..E-1); a plan's may be -1 (dropped)
            flat = plan_m.reshape(-1)
            ls.exps, ls.counts = access_order(flat if plan is None else flat[flat >= 0], run.E)
        return ls

    def take_units(self, ls: LayerStep) -> None:
        """Each planned GPU expert's parts, pinned: resident (a hit), issued (late) or absent (a
        demand unit is made, in :attr:`LayerStep.miss_units`; a prefetch still waiting for
        draining room becomes one); an expert with some parts resident is partial. Counts the
        outcomes and the fetches used (a unit's first use since it was brought in)."""
        run = self.run
        st = self.stats
        vram = self.vram
        units = vram.units
        pinned = vram.pinned
        layer = ls.layer
        fr = run.fractions[layer]
        nparts = len(fr)
        pool = 0 if run.global_pool else layer
        exps, counts = ls.exps, ls.counts
        exp_cost = self.exp_cost
        status = ls.status
        need = ls.need
        miss_units = ls.miss_units
        hits = late = part = miss = miss_bytes = 0
        if nparts == 1:   # whole experts (most runs): the loop below without its inner loop
            keys = []   # a plain loop: a comprehension is a call of its own, and the list is short
            for e in exps:
                keys.append((layer, e, 0))
            pinned.update(keys)
            nbytes = run.part_bytes(layer, 0)
            f0 = fr[0]
            for i, key in enumerate(keys):
                c = counts[i]
                t_exp = exp_cost.get(c)
                if t_exp is None:
                    t_exp = exp_cost[c] = self.cost.expert_s(c)
                u = units.get(key)
                if u is not None and u.state == WAITING and not u.demand:
                    self.tx.demand_instead(u)
                    u = None
                if u is None:
                    u = Unit(key, nbytes, pool, True)
                    vram.add(u)
                    miss_units.append(u)
                    miss_bytes += nbytes
                    status.append(MISS)
                    miss += 1
                elif u.state == RESIDENT:
                    status.append(HIT)
                    hits += 1
                else:
                    status.append(LATE)
                    late += 1
                if not u.used:   # brought in since its previous use: by a prefetch, or on demand
                    st.fetch_needed += 1
                    if not u.demand:
                        st.fetch_covered += 1
                        st.prefetch_used += 1
                    u.used = True
                need.append((i, t_exp * f0, u))
        else:
            sizes = run.sizes_of(layer)   # bytes of each part, looked up once per layer
            for e in exps:
                for p in range(nparts):
                    pinned.add((layer, e, p))
            for i, e in enumerate(exps):
                c = counts[i]
                t_exp = exp_cost.get(c)
                if t_exp is None:
                    t_exp = exp_cost[c] = self.cost.expert_s(c)
                n_res = n_abs = 0
                fetched = covered = False
                for p in range(nparts):
                    key = (layer, e, p)
                    u = units.get(key)
                    if u is not None and u.state == WAITING and not u.demand:
                        self.tx.demand_instead(u)
                        u = None
                    if u is None:
                        n_abs += 1
                        u = Unit(key, sizes[p], pool, True)
                        vram.add(u)
                        miss_units.append(u)
                        miss_bytes += u.nbytes
                    elif u.state == RESIDENT:
                        n_res += 1
                    if not u.used:
                        # brought in since its previous use: by a prefetch, or on demand
                        fetched = True
                        if not u.demand:
                            covered = True
                            st.prefetch_used += 1
                        u.used = True
                    need.append((i, t_exp * fr[p], u))
                if n_res == nparts:
                    status.append(HIT)
                    hits += 1
                elif n_abs == 0:
                    status.append(LATE)
                    late += 1
                elif n_res:
                    status.append(PARTIAL)
                    part += 1
                else:
                    status.append(MISS)
                    miss += 1
                if fetched:
                    st.fetch_needed += 1
                    if covered:
                        st.fetch_covered += 1
        st.hits += hits
        st.late += late
        st.partial += part
        st.misses += miss
        ls.hits, ls.late, ls.part, ls.miss, ls.miss_bytes = hits, late, part, miss, miss_bytes

    def waits_of(self, ls: LayerStep) -> list[Unit]:
        """The present units of the copies the plan waits for (``wait_for``: a whole expert
        tensor copied to run any of it)."""
        plan = ls.plan
        if plan is None or not plan.wait_for:
            return []
        return self.tx.issued_units(ls.layer, plan.wait_for, ls.exps, len(self.run.fractions[ls.layer]),
                                    self.policy.name)

    def cpu_experts(self, ls: LayerStep, now: float) -> float:
        """The layer's CPU experts queue on the host from ``now`` (after what it still runs), one
        after another, behind the runtime's hand-off to the CPU (``cpu_switch_s``, once per
        layer, counted as CPU busy time); returns when the last ends (0.0: none)."""
        if not ls.cpu_exps:
            return 0.0
        run = self.run
        cost_of = self.cpu_cost
        start = max(now, run.cpu_free_at)
        tc = start
        timeline = self.timeline
        switch = self.cost.cpu_switch_s(ls.it.n_tokens) if self.copies else self.cpu_switch
        if switch:
            if timeline is not None:
                timeline.append(("CPU experts", f"L{ls.layer} hand-off", tc, switch, {}))
            tc += switch
        for e, c in zip(ls.cpu_exps, ls.cpu_counts, strict=True):
            dt = cost_of.get(c)
            if dt is None:
                dt = cost_of[c] = self.cost.cpu_expert_s(c)
            if timeline is not None:
                timeline.append(("CPU experts", f"L{ls.layer} E{e}", tc, dt, {"tokens": c}))
            tc += dt
        st = self.stats
        st.cpu_busy_s += tc - start
        st.cpu_accesses += len(ls.cpu_exps)
        run.cpu_free_at = tc
        return tc

    def notify(self, ls: LayerStep) -> None:
        """The layer's outcome to the policy, once its demand loads are issued: ``on_access``,
        then ``after_layer`` (where it prefetches)."""
        if self.has_access or self.has_after:
            routing = ls.routing
            assert routing is not None
            plan_m = routing.experts if ls.plan_m is None else ls.plan_m
            outcome = Outcome(ls.layer, routing, plan_m, ls.exps, ls.status, ls.cpu_exps)
            if self.has_access:
                self.policy.on_access(self.view, ls.layer, outcome)
            if self.has_after:
                self.policy.after_layer(self.view, ls.layer, outcome)

    @staticmethod
    def early_of(ls: LayerStep) -> set[int]:
        """:func:`early_parts` of ``ls`` (once per layer: the fixed order while demand loads wait)."""
        if ls.early is None:
            ls.early = early_parts(ls.need, ls.miss_units)
        return ls.early

    def end_layer(self, ls: LayerStep, now: float) -> None:
        """The layer ends at ``now``: pins released, its stall counted, its units left in the
        transfer buffer settled, the policy's ``on_layer_end``, the VRAM invariant (when
        checked), its step record."""
        run = self.run
        vram = self.vram
        vram.pinned.clear()
        self.stats.stall_s += ls.stall
        layer = ls.layer
        if vram.buffer_used:
            self.tx.settle_buffer(layer)
        if self.has_end:
            self.policy.on_layer_end(self.view, layer)
        if run.check_invariants:
            vram.check()
        rows = self.step_rows
        if rows is not None:
            tx = self.tx
            rows.append((ls.it.index, layer, ls.t0, ls.t_route, now, len(ls.exps), ls.hits, ls.late, ls.part,
                         ls.miss, len(ls.cpu_exps), ls.stall, ls.miss_bytes, tx.layer_prefetch_bytes,
                         tx.layer_evictions))
            if len(rows) >= STEP_CHUNK:
                run.steps.pack()
                self.step_rows = run.steps.rows

    def timeline_event(self, lane: str, name: str, start: float, dt: float, args: dict[str, Any]) -> None:
        """A span on the timeline, when it is recorded."""
        if self.timeline is not None:
            self.timeline.append((lane, name, start, dt, args))
