"""The GPU stream of the event loop: one SimPy process over iterations x MoE layers, calling
the policy's hooks in contract order (:mod:`moesim.policies.contract.base`) on a run's
:class:`~moesim.sim.engine.state.RunState`.

Per layer: the policy's ``before_layer``; the non-MoE compute (plus the runtime's overhead);
routing known, ``on_routed`` returns the plan; each planned expert part is resident (hit),
issued (late) or absent (a demand load, ahead of queued prefetches under priority order);
``on_access`` and ``after_layer`` run while the loads are under way; expert parts compute as
they become resident (ready ones first; while demand loads wait for room, one at a time in the
fixed order of :func:`moesim.sim.engine.plans.next_in_fixed_order`) on the GPU, CPU slots on the CPU;
the layer also waits for the copies its plan's ``wait_for`` names; ``on_layer_end``.
A demand load that finds no room waits (a stall), after the engine has withdrawn queued
prefetches of that pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from moesim.policies.contract.base import (
    HIT,
    INFLIGHT,
    LATE,
    MISS,
    PARTIAL,
    QUEUED,
    RESIDENT,
    WAITING,
    Outcome,
    Routing,
)
from moesim.sim.engine.clock import advance_alone
from moesim.sim.engine.frozen import slot_maker
from moesim.sim.engine.plans import access_order, check_plan, count_lossy, next_in_fixed_order
from moesim.sim.engine.records import STEP_CHUNK
from moesim.sim.engine.splits import apply_fractions
from moesim.sim.engine.vram import Unit

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

new_routing = slot_maker(Routing)   # Routing(layer, experts, weights), once per layer


def charge(run: RunState[Transfers], env: simpy.Environment) -> Any:
    """Process fragment: the GPU stream waits for the host time spent since the last charge:
    policy CPU time (``policy_cpu_s``) and the runtime's prefetch issue cost (``overhead_s``)."""
    dt = run.spent_s
    if dt > 0:
        run.spent_s = 0.0
        issue = run.issue_spent_s
        t0 = env.now
        yield env.timeout(dt)
        if issue:
            run.issue_spent_s = 0.0
            run.stats.overhead_s += issue
            run.stats.policy_cpu_s += dt - issue
        else:
            run.stats.policy_cpu_s += dt
        if run.record_timeline:
            if issue:
                run.timeline.append(("CPU runtime", "prefetch issue", t0, issue, {}))
            if dt - issue > 0:
                run.timeline.append(("CPU policy", "decision", t0 + issue, dt - issue, {}))


def grant_demand(tx: Transfers, timeout: Callable[[float], simpy.Event]) -> Any:
    """Process fragment: room for the waiting demand loads that can have it now; the GPU stream
    pays their eviction and demand-load costs, then they are queued. Returns that delay."""
    granted, delay = tx.grant_waiting()
    if delay > 0:
        yield timeout(delay)
    tx.queue_demand(granted)
    return delay


def wait_prefetches(run: RunState[Transfers], env: simpy.Environment) -> Any:
    """Process fragment (``sync_prefetch``): the GPU waits for every prefetch issued so far."""
    pending = [run.transfers.landing(u) for u in run.vram.units.values()
               if not u.demand and u.state in (WAITING, QUEUED, INFLIGHT)]
    if pending:
        t0 = env.now
        yield env.all_of(pending)
        dt = env.now - t0
        run.stats.stall_s += dt
        run.stats.sync_stall_s += dt


def gpu_process(run: RunState[Transfers], env: simpy.Environment) -> Any:
    """The GPU stream of ``run`` on ``env``, as a SimPy process (see the module
    docstring). It reads the clock as ``env._now`` (what ``env.now`` returns, without the
    property call; the loop reads it about ten times per layer), as
    :func:`~moesim.sim.engine.clock.advance_alone` does."""
    cost = run.cost
    L = run.L
    st = run.stats
    policy = run.policy
    view = run.view
    vram = run.vram
    tx = run.transfers
    units = vram.units
    pinned = vram.pinned
    part_bytes = run.part_bytes
    splits = policy.uses_hook("part_fractions")
    timeline = run.timeline if run.record_timeline else None
    steps = run.steps
    step_rows = steps.rows if run.record_steps else None   # appended inline (see StepRecords)
    iters = run.workload.iterations
    n_iters = len(iters)
    batch_start: dict[int, float] = {}
    exp_cost: dict[int, float] = {}
    cpu_cost: dict[int, float] = {}
    # skip calls of hooks a policy does not override (the hot path runs per layer)
    has_before = policy.uses_hook("before_layer")
    has_routed = policy.uses_hook("on_routed")
    has_access = policy.uses_hook("on_access")
    has_after = policy.uses_hook("after_layer")
    has_end = policy.uses_hook("on_layer_end")
    # hooks bound once (a policy's methods do not change during a run)
    before_layer, on_routed, on_access = policy.before_layer, policy.on_routed, policy.on_access
    after_layer, on_layer_end = policy.after_layer, policy.on_layer_end
    lossy = policy.lossy
    decision_s = float(policy.decision_us) * 1e-6
    overhead_layer = cost.overhead_layer_s()
    timeout = env.timeout
    grant_waiting, queue_demand = tx.grant_waiting, tx.queue_demand
    tr_experts, tr_weights = run.trace.experts, run.trace.weights
    for it in iters:
        run.cur_iter = it
        tx.iteration = it.index
        run.cur_layer = -1
        run.routed_upto = -1
        st.start_iteration(it, env._now, batch_start)
        policy.on_iteration_start(view)
        if run.spent_s:
            yield from charge(run, env)
        n_tok = it.n_tokens
        row0 = int(it.rows0[0]) if n_tok == 1 else -1
        layer_s = cost.layer_s(n_tok)
        for layer in range(L):
            run.cur_layer = layer
            tx.layer_evictions = 0
            tx.layer_prefetch_bytes = 0
            if run.sync_prefetch:
                yield from wait_prefetches(run, env)
            t0 = env._now
            if has_before:
                before_layer(view, layer)
                if run.spent_s:
                    yield from charge(run, env)
            # non-MoE compute, and the runtime's per-layer overhead
            if not advance_alone(env, layer_s + overhead_layer):
                yield timeout(layer_s + overhead_layer)
            st.gpu_busy_s += layer_s
            st.overhead_s += overhead_layer
            if timeline is not None:
                timeline.append(("GPU", f"L{layer} attn", env._now - layer_s - overhead_layer,
                                 layer_s + overhead_layer, {"iteration": it.index}))
            # routing known: the plan
            run.routed_upto = layer
            # the routing (as routing_of gives it; a one-row slice view for one token)
            rows: slice | np.ndarray = slice(row0 + layer, row0 + layer + 1) if row0 >= 0 else it.rows0 + layer
            routing = new_routing(layer, tr_experts[rows], None if tr_weights is None else tr_weights[rows])
            plan = on_routed(view, layer, routing) if has_routed else None
            on_cpu = None
            if plan is None:
                plan_m = routing.experts
                if lossy:
                    count_lossy(st, routing, None)
            else:
                plan_m = check_plan(plan, routing, policy_name=policy.name, lossy=lossy, num_experts=run.E,
                                    iteration=it.index, layer=layer)
                on_cpu = None if plan.on_cpu is None else np.asarray(plan.on_cpu, dtype=bool)
                if lossy:
                    count_lossy(st, routing, plan_m)
            if decision_s:
                run.spent_s += decision_s
            if run.spent_s:
                yield from charge(run, env)
            t_route = env._now
            # experts that run on the GPU (access order) and on the CPU, with token counts
            cpu_exps: list[int] = []
            cpu_counts: list[int] = []
            if on_cpu is not None and on_cpu.any():
                gmask = (plan_m >= 0) & ~on_cpu
                cmask = (plan_m >= 0) & on_cpu
                cpu_exps, cpu_counts = access_order(plan_m[cmask])
                exps, counts = access_order(plan_m[gmask])
            elif n_tok == 1:
                exps = plan_m.tolist()[0]   # [1, k]: its one row, without a reshaped view
                if -1 in exps:   # slots a plan dropped (plans hold -1..E-1, the trace 0..E-1)
                    exps = [x for x in exps if x >= 0]
                counts = [1] * len(exps)
            else:
                flat = plan_m.reshape(-1)
                exps, counts = access_order(flat[flat >= 0])
            fr = run.fractions[layer]
            nparts = len(fr)
            pool = 0 if run.global_pool else layer
            status: list[int] = []
            need: list[tuple[int, float, Unit]] = []  # (expert index, compute seconds, unit)
            miss_units: list[Unit] = []
            hits = late = part = miss = miss_bytes = 0
            if nparts == 1:
                for e in exps:
                    pinned.add((layer, e, 0))
            else:
                for e in exps:
                    for p in range(nparts):
                        pinned.add((layer, e, p))
            for i, e in enumerate(exps):
                c = counts[i]
                t_exp = exp_cost.get(c)
                if t_exp is None:
                    t_exp = exp_cost[c] = cost.expert_s(c)
                n_res = n_abs = 0
                fetched = covered = False
                for p in range(nparts):
                    key = (layer, e, p)
                    u = units.get(key)
                    if u is not None and u.state == WAITING and not u.demand:
                        tx.demand_instead(u)
                        u = None
                    if u is None:
                        n_abs += 1
                        u = Unit(key, part_bytes(layer, p), pool, True)
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
            waits = () if plan is None or not plan.wait_for else tx.issued_units(
                layer, plan.wait_for, exps, nparts, policy.name)
            # CPU experts start now, one after another on the host
            cpu_done = 0.0
            if cpu_exps:
                start = max(env._now, run.cpu_free_at)
                tc = start
                for e, c in zip(cpu_exps, cpu_counts, strict=True):
                    dt = cpu_cost.get(c)
                    if dt is None:
                        dt = cpu_cost[c] = cost.cpu_expert_s(c)
                    if timeline is not None:
                        timeline.append(("CPU experts", f"L{layer} E{e}", tc, dt, {"tokens": c}))
                    tc += dt
                st.cpu_busy_s += tc - start
                st.cpu_accesses += len(cpu_exps)
                run.cpu_free_at = cpu_done = tc
            # demand loads for absent parts, ahead of queued prefetches
            stall = 0.0
            if miss_units:
                tx.waiting.extend(miss_units)
            if tx.waiting:   # grant_demand, inlined (a generator per layer otherwise)
                granted, delay = grant_waiting()
                if delay > 0:
                    yield timeout(delay)
                queue_demand(granted)
                stall += delay
            if has_access or has_after:
                outcome = Outcome(layer, routing, plan_m, exps, status, cpu_exps)
                if has_access:
                    on_access(view, layer, outcome)
                if has_after:
                    after_layer(view, layer, outcome)
                if run.spent_s:
                    yield from charge(run, env)
            # GPU experts compute as their parts become resident, ready ones first
            remaining = need
            early: set[int] | None = None
            watch = remaining
            while remaining:
                # plain loops: a comprehension is a call of its own, and these lists are short
                ready: list[tuple[int, float, Unit]] = []
                rest: list[tuple[int, float, Unit]] = []   # the others, in order
                if tx.waiting:
                    # memory is tight: one expert part at a time, in a fixed order, so that the
                    # room each frees does not depend on when copies land (sim/engine/plans.py)
                    if early is None:
                        fresh = {id(u) for u in miss_units}
                        early = {id(x) for x in need if id(x[2]) not in fresh}
                    head = next_in_fixed_order(remaining, early)
                    watch = [head]
                    if head[2].state == RESIDENT:
                        ready = [head]
                        rest = [x for x in remaining if x is not head]
                else:
                    watch = remaining
                    for x in remaining:
                        if x[2].state == RESIDENT:
                            ready.append(x)
                        else:
                            rest.append(x)
                if ready:
                    dt = ready[0][1] if len(ready) == 1 else sum([x[1] for x in ready])   # 0 + a is a
                    tc = env._now
                    if not advance_alone(env, dt):
                        yield timeout(dt)
                    st.gpu_busy_s += dt
                    if timeline is not None:
                        timeline.append(("GPU", f"L{layer} experts", tc, dt,
                                         {"experts": [exps[x[0]] for x in ready]}))
                    remaining = rest
                    for x in ready:
                        bu = x[2]
                        pinned.discard(bu.key)
                        if bu.in_buffer:   # free the staging room at once
                            tx.settle(bu)
                    if tx.waiting:   # grant_demand, inlined
                        granted, delay = grant_waiting()
                        if delay > 0:
                            yield timeout(delay)
                        queue_demand(granted)
                        stall += delay
                    continue
                # nothing ready: wait for a transfer, or for room
                ts = env._now
                evs = []
                for x in watch:
                    if x[2].state in (QUEUED, INFLIGHT):
                        evs.append(tx.landing(x[2]))
                if evs:
                    yield evs[0] if len(evs) == 1 else any_of(env, evs)
                elif tx.waiting:
                    if tx.space_event.triggered:   # room was freed since we last tried
                        tx.space_event = env.event()
                        yield from grant_demand(tx, timeout)   # its wait is in the stall measured around
                    else:
                        tx.check_deadlock(layer)
                        yield tx.space_event
                else:  # pragma: no cover - every remaining unit is resident, queued, in flight or waiting
                    raise AssertionError("expert part neither present nor waiting")
                stall += env._now - ts
            if waits:   # copies the plan waits for (a whole expert tensor copied to run any of it)
                pending = [tx.landing(u) for u in waits if u.state != RESIDENT and units.get(u.key) is u]
                if pending:
                    ts = env._now
                    yield pending[0] if len(pending) == 1 else env.all_of(pending)
                    stall += env._now - ts
            if cpu_done > env._now:   # the layer also waits for its CPU experts
                wait = cpu_done - env._now
                yield timeout(wait)
                st.cpu_wait_s += wait
            pinned.clear()
            st.stall_s += stall
            if vram.buffer_used:
                tx.settle_buffer(layer)
            if has_end:
                on_layer_end(view, layer)
            if run.check_invariants:
                vram.check()
            if step_rows is not None:
                step_rows.append((it.index, layer, t0, t_route, env._now, len(exps), hits, late, part,
                              miss, len(cpu_exps), stall, miss_bytes, tx.layer_prefetch_bytes,
                              tx.layer_evictions))
                if len(step_rows) >= STEP_CHUNK:
                    steps.pack()
                    step_rows = steps.rows
        head = cost.head_s(n_tok)
        over = cost.overhead_iteration_s(n_tok)
        if head + over > 0:
            if not advance_alone(env, head + over):
                yield timeout(head + over)
            st.gpu_busy_s += head
            st.overhead_s += over
        now = env._now
        st.end_iteration(it, now)
        run.cur_layer = L
        policy.on_iteration_end(view)
        if run.spent_s:
            yield from charge(run, env)
        if splits:
            apply_fractions(run)
        run.prev_iter = it
        if run.progress is not None:
            run.progress(it.index + 1, n_iters)


def any_of(env: simpy.Environment, events: list[simpy.Event]) -> simpy.Event:
    """An event that succeeds when the first of ``events`` (untriggered landings) is
    processed: what ``env.any_of`` gives, scheduled at the same instant and in the same order
    (one ``succeed`` from the first callback), without building a condition value."""
    any_ev = env.event()

    def fire(_ev: simpy.Event) -> None:
        if not any_ev.triggered:
            any_ev.succeed()

    for ev in events:
        assert ev.callbacks is not None   # not yet processed: the unit is queued or in flight
        ev.callbacks.append(fire)
    return any_ev
