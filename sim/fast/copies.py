"""The copy lanes without SimPy: :class:`~moesim.sim.engine.lanes.CopyLanes`'s queue, lanes and
withdrawals as they are, with its one SimPy part (a transfer is a timeout whose callback lands
it) replaced by a heap of landings on a :class:`Clock`; the host-to-device lanes and the
device-to-host one (``cache.swap_out``) share it. The clock is also the GPU stream's
:class:`~moesim.sim.engine.layer_loop.Waits` in the SimPy-free driver (:mod:`moesim.sim.fast.driver`):
each wait processes the landings due meanwhile and returns when it is over.

Ties are resolved as SimPy resolves them: every event is ordered by (time, creation order), and
each of the GPU's timeouts takes a creation order from the same counter (:meth:`Clock.run_for`).
A landing the GPU waits for wakes it either right after that landing (it waited on the
transfer's own timeout, as when the unit was in flight) or after every landing due at that
instant (an event succeeded by the landing, scheduled behind them: the unit was queued when the
GPU began to wait, or it waited for several, or for room).

A unit's ``event`` holds an :class:`Ev` in place of SimPy's event: its ``callbacks`` are what
:meth:`~moesim.sim.engine.withdrawals.Withdrawals._awaited` reads (the lane's own, then the
GPU's while it waits, None once processed), as SimPy's are.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, cast

from moesim.policies.contract.base import RESIDENT
from moesim.sim.engine.lanes import CopyLanes
from moesim.sim.engine.transfers import PolicyError

if TYPE_CHECKING:
    import simpy

    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

LANE, GPU = "lane", "gpu"   # who waits on an event (its callbacks)


class Ev:
    """A landing's event: its waiters (``callbacks``; None once processed). Made without an
    ``__init__`` call (one per transfer): :func:`new_ev`, inline where a transfer starts."""

    __slots__ = ("callbacks",)
    callbacks: list[str] | None


_new = object.__new__


def new_ev(first: str) -> Ev:
    """An :class:`Ev` whose first waiter is ``first`` (:data:`LANE` or :data:`GPU`)."""
    ev: Ev = _new(Ev)
    ev.callbacks = [first]
    return ev


class Clock:
    """The driver's time (``_now``, mirrored in ``state.fast_now``, which the view reads) and
    the landings of every lane, in SimPy's order; its ``run_for``, ``land_one``, ``land_any``,
    ``land_all`` and ``room`` are the GPU stream's waits, each over when it returns."""

    def __init__(self, state: RunState[Transfers]) -> None:
        self.state = state
        self._now = 0.0
        self.q = 0                                                          # creation order of the next event
        self.heap: list[tuple[float, int, int, Ev, FastLanes]] = []         # (time, creation order, lane, event, lanes)

    def adopt(self, env: simpy.Environment, pairs: list[tuple[CopyLanes, FastLanes]]) -> None:
        """Take over the queues and transfers in flight of the SimPy lanes of ``pairs`` (copies
        issued before the first iteration, as a policy's ``warm`` may issue them, on the SimPy
        clock at 0: none has landed), their landings scheduled in the order of their SimPy event ids."""
        eid = {id(e[3]): e[2] for e in env._queue}
        flying = []
        for slow, fast in pairs:
            fast.queue, fast.idle, fast._seq = list(slow.queue), list(slow.idle), slow._seq
            fast.busy_s, fast.inflight_count = slow.busy_s, slow.inflight_count
            flying += [(eid[id(cur[4])], lane, fast, cur) for lane, cur in enumerate(slow.current) if cur is not None]
        for _, lane, fast, (u, cls, start, dur, sev) in sorted(flying, key=lambda f: f[0]):
            ev = new_ev(LANE)
            heappush(self.heap, (start + dur, self.q, lane, ev, fast))
            self.q += 1
            fast.current[lane] = (u, cls, start, dur, cast("simpy.Event", ev))
            if u.event is sev:
                u.event = ev

    def land(self) -> tuple[float, Any]:
        """Process the next landing (as the transfer's timeout callback does: its lane lands it
        and starts the next queued transfer); returns its time and unit (None: a transfer
        aborted meanwhile, whose timeout still fires, its lane having moved on)."""
        try:
            t, _, lane, ev, lanes = heappop(self.heap)
        except IndexError:   # nothing is scheduled while the GPU waits: as the event loop reports it
            st = self.state
            raise PolicyError(f"the simulation stalled at iteration {st.cur_iter.index}, layer {st.cur_layer}: the GPU"
                              f" waits for an event that nothing will trigger (policy {st.policy.name!r})") from None
        ev.callbacks = None
        self._now = t
        self.state.fast_now = t
        # the lane lands its transfer, as CopyLanes._on_timeout does (inline: once per transfer)
        cur = lanes.current[lane]
        if cur is None or cur[4] is not ev:   # type: ignore[comparison-overlap]  # an Ev (see FastLanes._start)
            return t, None
        u, cls, start, dur, _ = cur
        lanes.current[lane] = None
        lanes.busy_s += dur
        lanes.inflight_count -= 1
        wev = u.event
        lanes.on_land(u, cls, lane, start, dur)
        if wev is not ev and wev is not None and wev.callbacks is not None:
            wev.callbacks = None   # a waiter's event: succeeded now (scheduled behind this instant's landings)
            self.q += 1
        queue = lanes.queue   # lanes._next(lane) without the call: the next queued transfer starts
        queued = lanes.QUEUED
        while queue:
            _, _, _, nu, ncls = heappop(queue)
            if nu.state == queued:   # else withdrawn meanwhile
                lanes._start(nu, ncls, lane)
                return t, u
        lanes.idle.append(lane)   # nothing queued: the lane idles
        return t, u

    def run_for(self, dt: float) -> None:
        """The GPU is busy (or idle) for ``dt`` seconds: a GPU timeout to ``now + dt``, created
        now. Every landing SimPy processes before it comes first (those due earlier, and those
        due then that were created earlier); none is due by then: the clock moves alone (as
        :func:`~moesim.sim.engine.clock.timeout_unless_alone`)."""
        T = self._now + dt
        heap = self.heap
        if heap and heap[0][0] <= T:
            g = self.q
            self.q += 1
            while heap and (heap[0][0] < T or (heap[0][0] == T and heap[0][1] < g)):
                self.land()
        self._now = self.state.fast_now = T

    def flush(self, t: float) -> None:
        """The GPU resumes through an event scheduled at ``t`` now: the landings due at ``t``
        come first."""
        heap = self.heap
        self.q += 1
        while heap and heap[0][0] <= t:
            self.land()
        self._now = self.state.fast_now = t

    @staticmethod
    def _await(units: list[Any]) -> None:
        """The GPU waits on each unit's landing event (made now if it has none: it is queued)."""
        for u in units:
            ev = u.event
            if ev is None:
                u.event = new_ev(GPU)
            else:
                ev.callbacks.append(GPU)

    def land_one(self, u: Any) -> None:
        """The GPU waits for ``u`` (queued or in flight) to land: right after the landing when
        it waits on the transfer's own timeout, else through an event behind that instant's."""
        ev = u.event
        # in flight, and this is its transfer's timeout (a waiter's event is made with [GPU];
        # a unit waited for has not landed, so its event is not processed)
        direct = ev is not None and ev.callbacks[0] is LANE
        self._await([u])
        t = self._now
        while u.state != RESIDENT:
            t, _ = self.land()
        if direct:
            self._now = self.state.fast_now = t
        else:
            self.flush(t)

    def land_any(self, units: list[Any]) -> None:
        """The GPU waits for the first of ``units`` (several, queued or in flight) to land,
        through an event scheduled after that landing."""
        self._await(units)
        while True:
            t, v = self.land()
            if v is not None and v in units:   # by identity (a Unit has no __eq__)
                break
        self.flush(t)

    def land_all(self, units: list[Any]) -> None:
        """The GPU waits for every one of ``units`` to land, through a condition event (as
        ``env.all_of``)."""
        self._await(units)
        t = self._now
        for u in units:   # each lands once (a condition event fires once all have)
            while u.state != RESIDENT:
                t, _ = self.land()
        self.flush(t)

    def room(self) -> None:
        """The GPU waits for room (the transfers' ``space_event``, succeeded by a landing or what
        it set off)."""
        tx = self.state.transfers
        t = self._now
        while not tx.space_event.triggered:
            t, _ = self.land()
        self.flush(t)



class FastLanes(CopyLanes):
    """Copy lanes (as :class:`~moesim.sim.engine.lanes.CopyLanes` is built) on a :class:`Clock`
    in place of SimPy's environment (``env``)."""

    def __init__(self, clock: Clock, *args: Any, **kwargs: Any) -> None:
        super().__init__(cast("simpy.Environment", clock), *args, **kwargs)
        self.clock = clock

    def _start(self, u: Any, cls: int, lane: int) -> None:
        """``u``'s transfer starts on ``lane`` now: its landing is scheduled."""
        u.state = self.INFLIGHT
        nbytes = u.nbytes
        dur = self._dur.get(nbytes)
        if dur is None:
            dur = self._dur[nbytes] = self.duration(nbytes)
        clock = self.clock
        start = clock._now
        self.inflight_count += 1
        self.on_start(u, cls, lane)
        ev = _new(Ev)   # new_ev(LANE) without the call (once per transfer)
        ev.callbacks = [LANE]
        heappush(clock.heap, (start + dur, clock.q, lane, ev, self))
        clock.q += 1
        self.current[lane] = (u, cls, start, dur, ev)   # type: ignore[assignment]  # an Ev for the timeout
        if u.event is None:
            u.event = ev
