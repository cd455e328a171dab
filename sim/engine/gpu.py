"""The GPU stream of the event loop (the reference replay): one SimPy process over iterations x
MoE layers that calls the step functions of :mod:`moesim.sim.engine.step` (the per-layer
semantics, stated there once) in the contract's order (:mod:`moesim.policies.contract.base`),
and advances time with SimPy events: compute as timeouts, copies landing as the lanes' events,
room as the transfers' ``space_event``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from moesim.policies.contract.base import INFLIGHT, QUEUED, RESIDENT, WAITING
from moesim.sim.engine.clock import advance_alone
from moesim.sim.engine.step import Stepper, ready_parts

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def charge(run: RunState[Transfers], env: simpy.Environment) -> Any:
    """Process fragment: the GPU stream waits for the host time spent since the last charge:
    policy CPU time (``policy_cpu_s``) and the runtime's prefetch issue cost (``overhead_s``)."""
    dt = run.spent_s
    if dt > 0:
        run.spent_s = 0.0
        issue = run.issue_spent_s
        t0 = env.now
        yield env.timeout(dt)
        book_charge(run, dt, issue)
        if run.record_timeline:
            if issue:
                run.timeline.append(("CPU runtime", "prefetch issue", t0, issue, {}))
            if dt - issue > 0:
                run.timeline.append(("CPU policy", "decision", t0 + issue, dt - issue, {}))


def book_charge(run: RunState[Transfers], dt: float, issue: float) -> None:
    """Count a charge of ``dt`` host seconds once the GPU waited them, ``issue`` of them (the
    prefetch issue cost spent before the wait) as overhead, the rest as policy CPU time."""
    if issue:
        run.issue_spent_s = 0.0
        run.stats.overhead_s += issue
        run.stats.policy_cpu_s += dt - issue
    else:
        run.stats.policy_cpu_s += dt


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
    """The GPU stream of ``run`` on ``env``, as a SimPy process: the step functions of
    :mod:`~moesim.sim.engine.step` in the contract's order, time advanced by SimPy events. It
    reads the clock as ``env._now`` (what ``env.now`` returns, without the property call), as
    :func:`~moesim.sim.engine.clock.advance_alone` does."""
    step = Stepper(run)
    st = run.stats
    policy = run.policy
    view = run.view
    tx = run.transfers
    units = run.vram.units
    pinned = run.vram.pinned
    timeout = env.timeout
    grant_waiting, queue_demand = tx.grant_waiting, tx.queue_demand
    # the step's functions and flags bound once (the loop runs per layer)
    begin_layer, route, take_units, end_layer = step.begin_layer, step.route, step.take_units, step.end_layer
    has_before, has_outcome = step.has_before, step.has_access or step.has_after
    timeline = step.timeline
    for it in step.iterations():
        start = step.begin_iteration(it, env._now)
        if start > env._now:   # serving: the GPU idles until a request arrives
            yield timeout(start - env._now)
        policy.on_iteration_start(view)
        if run.spent_s:
            yield from charge(run, env)
        layer_s, over_s = step.non_moe_s(it)
        for layer in range(run.L):
            begin_layer(layer)
            if run.sync_prefetch:
                yield from wait_prefetches(run, env)
            t0 = env._now
            if has_before:
                policy.before_layer(view, layer)
                if run.spent_s:
                    yield from charge(run, env)
            if not advance_alone(env, layer_s + over_s):
                yield timeout(layer_s + over_s)
            if timeline is not None:
                step.timeline_event("GPU", f"L{layer} attn", env._now - layer_s - over_s, layer_s + over_s,
                                    {"iteration": it.index})
            ls = route(it, layer, t0, layer_s, over_s)
            if run.spent_s:
                yield from charge(run, env)
            ls.t_route = env._now
            take_units(ls)
            waits = step.waits_of(ls) if ls.plan is not None else None
            cpu_done = step.cpu_experts(ls, env._now) if ls.cpu_exps else 0.0
            # demand loads for absent parts, ahead of queued prefetches
            if ls.miss_units:
                tx.waiting.extend(ls.miss_units)
            if tx.waiting:   # grant_demand, inlined (a generator per layer otherwise)
                granted, delay = grant_waiting()
                if delay > 0:
                    yield timeout(delay)
                queue_demand(granted)
                ls.stall += delay
            if has_outcome:
                step.notify(ls)
            if run.spent_s:
                yield from charge(run, env)
            # GPU experts compute as their parts become resident, ready ones first
            remaining = ls.need
            early = None
            while remaining:
                if tx.waiting and early is None:
                    early = step.early_of(ls)
                ready, remaining, watch = ready_parts(remaining, early if tx.waiting else None)
                if ready:
                    dt = ready[0][1] if len(ready) == 1 else sum([x[1] for x in ready])   # 0 + a is a
                    tc = env._now
                    if not advance_alone(env, dt):
                        yield timeout(dt)
                    st.gpu_busy_s += dt
                    if timeline is not None:
                        step.timeline_event("GPU", f"L{layer} experts", tc, dt,
                                            {"experts": [ls.exps[x[0]] for x in ready]})
                    for x in ready:   # computed: unpinned; one in the transfer buffer settles at once
                        bu = x[2]
                        pinned.discard(bu.key)
                        if bu.in_buffer:
                            tx.settle(bu)
                    if tx.waiting:   # grant_demand, inlined
                        granted, delay = grant_waiting()
                        if delay > 0:
                            yield timeout(delay)
                        queue_demand(granted)
                        ls.stall += delay
                    continue
                # nothing ready: wait for a transfer, or for room
                ts = env._now
                evs = []   # a plain loop: a comprehension is a call of its own, and the list is short
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
                ls.stall += env._now - ts
            if waits:   # copies the plan waits for
                pending = [tx.landing(u) for u in waits if u.state != RESIDENT and units.get(u.key) is u]
                if pending:
                    ts = env._now
                    yield pending[0] if len(pending) == 1 else env.all_of(pending)
                    ls.stall += env._now - ts
            if cpu_done > env._now:   # the layer also waits for its CPU experts
                wait = cpu_done - env._now
                yield timeout(wait)
                st.cpu_wait_s += wait
            end_layer(ls, env._now)
        head, over = step.tail_s(it)
        if head + over > 0:
            if not advance_alone(env, head + over):
                yield timeout(head + over)
            step.count_tail(head, over)
        step.end_iteration(it, env._now)
        policy.on_iteration_end(view)
        if run.spent_s:
            yield from charge(run, env)
        step.close_iteration(it)


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
