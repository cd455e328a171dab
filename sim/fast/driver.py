"""The SimPy-free driver: the step functions of :mod:`moesim.sim.engine.step` in the contract's
order, as :func:`~moesim.sim.engine.gpu.gpu_process` calls them, with time advanced by
arithmetic on :class:`~moesim.sim.fast.copies.FastLanes` (over a shared
:class:`~moesim.sim.fast.copies.Clock`) instead of SimPy events: the run's own
:class:`~moesim.sim.engine.transfers.Transfers` (room, victims, prefetches, withdrawals and
aborts), policy and view, and the lanes' landings ordered by (time, creation order) as SimPy
orders them.

It takes every policy, prefetching ones included, on the runs the fast path accepts
(:func:`~moesim.sim.fast.path.fast_path_refusal`: every option and field declared); the cache
kernels (:mod:`moesim.sim.fast.order`, :mod:`moesim.sim.fast.prefetch`) stand in for it where a
policy is one of their rules. ``tests/test_fastdriver.py`` compares it with the event loop for
every shipped policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moesim.policies.contract.base import INFLIGHT, QUEUED, RESIDENT, WAITING
from moesim.sim.engine.gpu import book_charge
from moesim.sim.engine.step import Stepper, ready_parts
from moesim.sim.engine.transfers import SWAP_QUEUED, SWAPPING
from moesim.sim.fast.copies import Clock, FastLanes

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def drive(run: RunState[Transfers]) -> None:
    """Replay ``run``'s whole workload (see the module docstring); leaves its counters, step
    records and clock (``run.fast_now``) as the event loop would, its transfers on the fast lanes."""
    tx = run.transfers
    cost = run.cost
    saved, saved_d2h = tx.lanes, tx.d2h
    clock = Clock(run)
    tx.lanes = FastLanes(clock, int(cost.hardware.copy_engines), cost.transfer_s, tx.count_start,
                         tx._on_transfer_land, queued=QUEUED, inflight=INFLIGHT,
                         order="priority" if saved.can_withdraw else "fifo")
    pairs = [(saved, tx.lanes)]
    if saved_d2h is not None:   # cache.swap_out: evicted units copy back to the host first
        tx.d2h = FastLanes(clock, 1, cost.d2h_transfer_s, lambda u, c, lane: None, tx._on_swap_land,
                           queued=SWAP_QUEUED, inflight=SWAPPING, order="fifo")
        pairs.append((saved_d2h, tx.d2h))
    clock.adopt(tx.env, pairs)   # copies a policy issued while it warmed up
    _drive(run, clock)   # the fast lanes stay the run's: they hold its state at the end


def _drive(run: RunState[Transfers], clock: Clock) -> None:
    step = Stepper(run)
    st = run.stats
    policy = run.policy
    view = run.view
    tx = run.transfers
    env = tx.env
    units = run.vram.units
    pinned = run.vram.pinned
    advance = clock.advance
    heap = clock.heap   # the landings (the same list throughout)
    grant_waiting, queue_demand = tx.grant_waiting, tx.queue_demand
    begin_layer, route, take_units, end_layer = step.begin_layer, step.route, step.take_units, step.end_layer
    has_before, has_outcome = step.has_before, step.has_access or step.has_after
    timeline = step.timeline

    def charge() -> None:
        """The GPU stream waits for the host time spent since the last charge (gpu.charge)."""
        dt = run.spent_s
        if dt <= 0:
            return
        run.spent_s = 0.0
        issue = run.issue_spent_s
        t0 = clock._now
        advance(t0 + dt)
        book_charge(run, dt, issue)
        if timeline is not None:
            if issue:
                timeline.append(("CPU runtime", "prefetch issue", t0, issue, {}))
            if dt - issue > 0:
                timeline.append(("CPU policy", "decision", t0 + issue, dt - issue, {}))

    def grant() -> float:
        granted, delay = grant_waiting()
        if delay > 0:
            advance(clock._now + delay)
        queue_demand(granted)
        return delay

    run.fast_now = 0.0
    for it in run.workload.iterations:
        start = step.begin_iteration(it, clock._now)
        if start > clock._now:   # the iteration starts later (when its requests arrive): the GPU idles
            clock.advance(start)
        policy.on_iteration_start(view)
        if run.spent_s:
            charge()
        layer_s, over_s = step.non_moe_s(it)
        for layer in range(run.L):
            begin_layer(layer)
            if run.sync_prefetch:   # the GPU waits for every prefetch issued so far (gpu.wait_prefetches)
                pending = [u for u in units.values() if not u.demand and u.state in (WAITING, QUEUED, INFLIGHT)]
                if pending:
                    ts = clock._now
                    clock.wait_all(pending, condition=True)
                    st.stall_s += clock._now - ts
                    st.sync_stall_s += clock._now - ts
            t0 = clock._now
            if has_before:
                policy.before_layer(view, layer)
                if run.spent_s:
                    charge()
            T = clock._now + (layer_s + over_s)
            if heap and heap[0][0] <= T:
                advance(T)
            else:   # nothing is due first (as gpu_process's advance_alone)
                clock._now = run.fast_now = T
            if timeline is not None:
                step.timeline_event("GPU", f"L{layer} attn", clock._now - layer_s - over_s, layer_s + over_s,
                                    {"iteration": it.index})
            ls = route(it, layer, t0, layer_s, over_s)
            if run.spent_s:
                charge()
            ls.t_route = clock._now
            take_units(ls)
            waits = step.waits_of(ls) if ls.plan is not None else None
            cpu_done = step.cpu_experts(ls, clock._now) if ls.cpu_exps else 0.0
            if ls.miss_units:
                tx.waiting.extend(ls.miss_units)
            if tx.waiting:
                ls.stall += grant()
            if has_outcome:
                step.notify(ls)
            if run.spent_s:
                charge()
            # GPU experts compute as their parts become resident, ready ones first
            remaining = ls.need
            early = None
            while remaining:
                if tx.waiting and early is None:
                    early = step.early_of(ls)
                ready, remaining, watch = ready_parts(remaining, early if tx.waiting else None)
                if ready:
                    dt = ready[0][1] if len(ready) == 1 else sum([x[1] for x in ready])
                    tc = clock._now
                    T = tc + dt
                    if heap and heap[0][0] <= T:
                        advance(T)
                    else:
                        clock._now = run.fast_now = T
                    st.gpu_busy_s += dt
                    if timeline is not None:
                        step.timeline_event("GPU", f"L{layer} experts", tc, dt,
                                            {"experts": [ls.exps[x[0]] for x in ready]})
                    for x in ready:   # computed: unpinned; one in the transfer buffer settles at once
                        bu = x[2]
                        pinned.discard(bu.key)
                        if bu.in_buffer:
                            tx.settle(bu)
                    if tx.waiting:
                        ls.stall += grant()
                    continue
                # nothing ready: wait for a transfer, or for room
                ts = clock._now
                evs = []   # a plain loop: a comprehension is a call of its own, and the list is short
                for x in watch:
                    if x[2].state in (QUEUED, INFLIGHT):
                        evs.append(x[2])
                if evs:
                    if len(evs) == 1:
                        clock.wait_one(evs[0])
                    else:
                        clock.wait_any(evs)
                elif tx.waiting:
                    if tx.space_event.triggered:   # room was freed since we last tried
                        tx.space_event = env.event()
                        grant()
                    else:
                        tx.check_deadlock(layer)
                        clock.wait_room(tx)
                else:  # pragma: no cover - every remaining unit is resident, queued, in flight or waiting
                    raise AssertionError("expert part neither present nor waiting")
                ls.stall += clock._now - ts
            if waits:   # copies the plan waits for
                pending = [u for u in waits if u.state != RESIDENT and units.get(u.key) is u]
                if pending:
                    ts = clock._now
                    clock.wait_all(pending)
                    ls.stall += clock._now - ts
            if cpu_done > clock._now:   # the layer also waits for its CPU experts
                wait = cpu_done - clock._now
                advance(clock._now + wait)
                st.cpu_wait_s += wait
            end_layer(ls, clock._now)
        head, over = step.tail_s(it)
        if head + over > 0:
            advance(clock._now + (head + over))
            step.count_tail(head, over)
        step.end_iteration(it, clock._now)
        policy.on_iteration_end(view)
        if run.spent_s:
            charge()
        step.close_iteration(it)
    clock.finish()
