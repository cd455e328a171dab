"""The GPU stream of a run, written once: iterations x MoE layers, each layer the step functions of
:mod:`moesim.sim.engine.step` in the contract's order (:mod:`moesim.policies.contract.base`)
with the GPU's waits between them. This is the one place that says what the GPU does and when
it waits; both replays run it:

* the event loop (:func:`moesim.sim.engine.gpu.gpu_process`, the reference) as a SimPy process,
  its :class:`Waits` turning each wait into the SimPy event the stream yields;
* the SimPy-free driver (:func:`moesim.sim.fast.driver.drive`), its :class:`Waits` (the
  :class:`~moesim.sim.fast.copies.Clock`) doing each wait at once by arithmetic: the stream never
  suspends there.

A wait is a call on ``waits`` that returns what the stream must yield to finish it, or None when
it is already over (always in the driver; in the event loop when nothing else can happen
meanwhile). Every wait reads ``yield ev`` only behind ``if ev is not None``, so the driver pays
a method call per wait and no generator switch. The stream reads the clock as ``clk._now`` (a
SimPy ``Environment`` or the driver's ``Clock``: both keep the time there) and never sets it.

Per iteration and layer (the waits in brackets; "host time" is what the policy and the
runtime spent on the host since the last charge, ``run.spent_s``, which the GPU waits out)::

    iteration start (serving: [idle until a request arrives]), on_iteration_start, [host time]
    for each layer:
        begin_layer; sync_prefetch: [every prefetch issued so far lands]
        before_layer, [host time]; [attention and the per-layer overhead]
        route (the plan), [host time]; take_units (hit / late / miss, demand units); CPU experts queue
        demand loads ask for room: [their eviction and load costs]; notify (on_access, after_layer); [host time]
        [the shared experts, when the runtime runs them after routing, beside the CPU experts]
        GPU experts compute as their parts become resident, ready ones first:
            [compute the ready ones]; then demand loads ask for room again
            or, none ready: [one watched part lands] / [any of them lands] / [room is freed]
        [the copies the plan waits for land]; [the CPU experts end]; end_layer
    [LM head and per-iteration overhead]; end_iteration, on_iteration_end, [host time]; close_iteration
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

from moesim.policies.contract.base import INFLIGHT, QUEUED, RESIDENT, WAITING
from moesim.sim.engine.part_order import ready_parts
from moesim.sim.engine.step import Stepper

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers
    from moesim.sim.engine.vram import Unit

Stream = Generator[Any, Any, None]
"""The GPU stream: a generator of what a replay's waits return to be yielded (SimPy events)."""


class Clocked(Protocol):
    """What the GPU stream reads the time from: a SimPy ``Environment`` or the driver's ``Clock``,
    both of which keep it in ``_now`` (read without a property call: the loop reads it often)."""

    @property
    def _now(self) -> float:
        """The simulated time, in seconds."""


class Waits(Protocol):
    """How a replay makes the GPU stream wait. Each method starts a wait and returns what the
    stream yields to finish it, or None when it is over already (see the module docstring)."""

    def run_for(self, dt: float) -> Any:
        """The GPU is busy (or idle) for ``dt`` seconds: a timeout of ``dt``."""

    def land_one(self, u: Unit) -> Any:
        """Until ``u`` (queued or in flight) lands: on its own landing event."""

    def land_any(self, units: list[Unit]) -> Any:
        """Until the first of ``units`` (several, queued or in flight) lands: through an event
        that one landing succeeds."""

    def land_all(self, units: list[Unit]) -> Any:
        """Until every one of ``units`` lands: through a condition event (``all_of``)."""

    def room(self) -> Any:
        """Until room is freed: the transfers' ``space_event``."""


def charge(run: RunState[Transfers], clk: Clocked, waits: Waits) -> Stream:
    """The GPU stream waits for the host time spent since the last charge (``run.spent_s``:
    policy CPU time and the runtime's prefetch issue cost), then counts and draws it."""
    dt = run.spent_s
    if dt > 0:
        run.spent_s = 0.0
        issue = run.issue_spent_s
        t0 = clk._now
        ev = waits.run_for(dt)
        if ev is not None:
            yield ev
        st = run.stats   # the issue cost spent before the wait is the runtime's overhead
        st.overhead_s += issue
        st.policy_cpu_s += dt - issue
        if issue:
            run.issue_spent_s = 0.0
        if run.record_timeline:
            if issue:
                run.timeline.append(("CPU runtime", "prefetch issue", t0, issue, {}))
            if dt - issue > 0:
                run.timeline.append(("CPU policy", "decision", t0 + issue, dt - issue, {}))


def gpu_stream(run: RunState[Transfers], clk: Clocked, waits: Waits) -> Stream:
    """The GPU stream of ``run``, over the clock ``clk`` (its time in ``clk._now``) and a
    replay's ``waits`` (see the module docstring)."""
    step = Stepper(run)
    st = run.stats
    policy = run.policy
    view = run.view
    tx = run.transfers
    units = run.vram.units
    pinned = run.vram.pinned
    run_for = waits.run_for
    # demand loads get room in order (grant_waiting: the eviction and demand-load costs the GPU
    # waits out before they queue) and are queued (queue_demand); inline in the loop below, as a
    # sub-generator per call would cost more than the call
    grant_waiting, queue_demand = tx.grant_waiting, tx.queue_demand
    # the step's functions and flags bound once (the loop runs per layer)
    begin_layer, route, take_units, end_layer = step.begin_layer, step.route, step.take_units, step.end_layer
    has_before, has_outcome = step.has_before, step.has_access or step.has_after
    timeline = step.timeline
    sync_prefetch = run.sync_prefetch
    for it in step.iterations():
        start = step.begin_iteration(it, clk._now)
        if start > clk._now:   # serving: the GPU idles until a request arrives
            ev = run_for(start - clk._now)
            if ev is not None:
                yield ev
        policy.on_iteration_start(view)
        if run.spent_s:
            yield from charge(run, clk, waits)
        layer_s, over_s = step.non_moe_s(it)
        shared_s = step.shared_after_route_s(it)   # runtime.overlap_shared_experts: run after routing
        before_s = layer_s - shared_s + over_s
        for layer in range(run.L):
            begin_layer(layer)
            if sync_prefetch:   # the GPU waits for every prefetch issued so far
                pending = [u for u in units.values() if not u.demand and u.state in (WAITING, QUEUED, INFLIGHT)]
                if pending:
                    ts = clk._now
                    ev = waits.land_all(pending)
                    if ev is not None:
                        yield ev
                    st.stall_s += clk._now - ts
                    st.sync_stall_s += clk._now - ts
            t0 = clk._now
            if has_before:
                policy.before_layer(view, layer)
                if run.spent_s:
                    yield from charge(run, clk, waits)
            ev = run_for(before_s)   # attention etc. and the runtime's per-layer overhead
            if ev is not None:
                yield ev
            if timeline is not None:
                step.timeline_event("GPU", f"L{layer} attn", clk._now - layer_s + shared_s - over_s, before_s,
                                    {"iteration": it.index})
            ls = route(it, layer, t0, layer_s, over_s)
            if run.spent_s:
                yield from charge(run, clk, waits)
            ls.t_route = clk._now
            take_units(ls)
            waits_for = step.waits_of(ls) if ls.plan is not None else None
            cpu_done = step.cpu_experts(ls, clk._now) if ls.cpu_exps else 0.0
            # demand loads for absent parts, ahead of queued prefetches
            if ls.miss_units:
                tx.waiting.extend(ls.miss_units)
            if tx.waiting:   # room for the demand loads that can have it now: the GPU pays its costs
                granted, delay = grant_waiting()
                if delay > 0:
                    ev = run_for(delay)
                    if ev is not None:
                        yield ev
                queue_demand(granted)
                ls.stall += delay
            if has_outcome:
                step.notify(ls)
            if run.spent_s:
                yield from charge(run, clk, waits)
            if shared_s:   # the shared experts, on the GPU while the CPU experts run (counted in route)
                ev = run_for(shared_s)
                if ev is not None:
                    yield ev
                if timeline is not None:
                    step.timeline_event("GPU", f"L{layer} shared experts", clk._now - shared_s, shared_s, {})
            # GPU experts compute as their parts become resident, ready ones first
            remaining = ls.need
            early = None
            while remaining:
                if tx.waiting:   # one part at a time, in the fixed order
                    if early is None:
                        early = step.early_of(ls)
                    ready, remaining, watch = ready_parts(remaining, early)
                else:   # ready_parts(remaining, None) without the call (the loop's most frequent one)
                    watch = remaining
                    ready = []
                    rest = []
                    for x in remaining:
                        if x[2].state == RESIDENT:
                            ready.append(x)
                        else:
                            rest.append(x)
                    remaining = rest
                if ready:
                    dt = ready[0][1] if len(ready) == 1 else sum([x[1] for x in ready])   # 0 + a is a
                    tc = clk._now
                    ev = run_for(dt)
                    if ev is not None:
                        yield ev
                    st.gpu_busy_s += dt
                    if timeline is not None:
                        step.timeline_event("GPU", f"L{layer} experts", tc, dt,
                                            {"experts": [ls.exps[x[0]] for x in ready]})
                    for x in ready:   # computed: unpinned; one in the transfer buffer settles at once
                        bu = x[2]
                        pinned.discard(bu.key)
                        if bu.in_buffer:
                            tx.settle(bu)
                    if tx.waiting:   # demand loads ask for room again (as above)
                        granted, delay = grant_waiting()
                        if delay > 0:
                            ev = run_for(delay)
                            if ev is not None:
                                yield ev
                        queue_demand(granted)
                        ls.stall += delay
                    continue
                # nothing ready: wait for a transfer, or for room
                ts = clk._now
                landing = []   # a plain loop: a comprehension is a call of its own, and the list is short
                for x in watch:
                    if x[2].state in (QUEUED, INFLIGHT):
                        landing.append(x[2])
                if landing:
                    ev = waits.land_one(landing[0]) if len(landing) == 1 else waits.land_any(landing)
                elif tx.waiting:
                    if tx.space_event.triggered:   # room was freed since we last tried
                        tx.space_event = tx.env.event()
                        granted, delay = grant_waiting()   # (as above) its wait is in the stall measured around
                        ev = run_for(delay) if delay > 0 else None
                        if ev is not None:
                            yield ev
                        queue_demand(granted)
                        ev = None
                    else:
                        tx.check_deadlock(layer)
                        ev = waits.room()
                else:  # pragma: no cover - every remaining unit is resident, queued, in flight or waiting
                    raise AssertionError("expert part neither present nor waiting")
                if ev is not None:
                    yield ev
                ls.stall += clk._now - ts
            if waits_for:   # copies the plan waits for
                pending = [u for u in waits_for if u.state != RESIDENT and units.get(u.key) is u]
                if pending:
                    ts = clk._now
                    ev = waits.land_one(pending[0]) if len(pending) == 1 else waits.land_all(pending)
                    if ev is not None:
                        yield ev
                    ls.stall += clk._now - ts
            if cpu_done > clk._now:   # the layer also waits for its CPU experts
                wait = cpu_done - clk._now
                ev = run_for(wait)
                if ev is not None:
                    yield ev
                st.cpu_wait_s += wait
            end_layer(ls, clk._now)
        head, over = step.tail_s(it)
        if head + over > 0:   # the LM head and the runtime's per-iteration overhead
            ev = run_for(head + over)
            if ev is not None:
                yield ev
            step.count_tail(head, over)
        step.end_iteration(it, clk._now)
        policy.on_iteration_end(view)
        if run.spent_s:
            yield from charge(run, clk, waits)
        step.close_iteration(it)
