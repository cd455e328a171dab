"""The copy lanes without SimPy: :class:`~moesim.sim.engine.lanes.CopyLanes`'s queue, lanes and
withdrawals as they are, with its one SimPy part (a transfer is a timeout whose callback lands
it) replaced by a heap of landings and a clock that the SimPy-free driver
(:mod:`moesim.sim.fast.driver`) moves.

Ties are resolved as SimPy resolves them: every event is ordered by (time, creation order), and
the driver gives each of the GPU's timeouts a creation order from the same counter
(:meth:`FastLanes.advance`). A landing the GPU waits for wakes it either right after that
landing (it waited on the transfer's own timeout, as when the unit was in flight) or after every
landing due at that instant (an event succeeded by the landing, scheduled behind them: the unit
was queued when the GPU began to wait, or it waited for several, or for room).

A unit's ``event`` holds an :class:`Ev` in place of SimPy's event: its ``callbacks`` are what
:meth:`~moesim.sim.engine.withdrawals.Withdrawals._awaited` reads (the lane's own, then the
GPU's while it waits, None once processed), as SimPy's are.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, cast

from moesim.policies.contract.base import INFLIGHT, QUEUED, RESIDENT
from moesim.sim.engine.lanes import CopyLanes

if TYPE_CHECKING:
    import simpy

    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

LANE, GPU = "lane", "gpu"   # who waits on an event (its callbacks)


class Ev:
    """A landing's event: its waiters (``callbacks``; None once processed)."""

    __slots__ = ("callbacks",)

    def __init__(self, callbacks: list[str]) -> None:
        self.callbacks: list[str] | None = callbacks


class FastLanes(CopyLanes):
    """``state``'s copy lanes (its hardware's ``copy_engines``, its ``pcie.order``) on the
    driver's clock ``_now`` (mirrored in ``state.fast_now``, which the view reads)."""

    def __init__(self, state: RunState[Transfers], fifo: bool) -> None:
        tx = state.transfers
        cost = state.cost
        super().__init__(cast("simpy.Environment", self), int(cost.hardware.copy_engines), cost.transfer_s,
                         tx.count_start, tx._on_transfer_land, queued=QUEUED, inflight=INFLIGHT,
                         order="fifo" if fifo else "priority")
        self.state = state
        self._now = 0.0
        self.q = 0                                            # creation order of the next event
        self.heap: list[tuple[float, int, int, Ev]] = []      # landings: (time, creation order, lane, event)

    def _start(self, u: Any, cls: int, lane: int) -> None:
        """``u``'s transfer starts on ``lane`` now: its landing is scheduled."""
        u.state = INFLIGHT
        nbytes = u.nbytes
        dur = self._dur.get(nbytes)
        if dur is None:
            dur = self._dur[nbytes] = self.duration(nbytes)
        start = self._now
        self.inflight_count += 1
        self.on_start(u, cls, lane)
        ev = Ev([LANE])
        heapq.heappush(self.heap, (start + dur, self.q, lane, ev))
        self.q += 1
        self.current[lane] = (u, cls, start, dur, cast("simpy.Event", ev))
        if u.event is None:
            u.event = ev

    def land(self) -> tuple[float, Any]:
        """Process the next landing (as its timeout's callback does); returns its time and unit
        (None: a transfer aborted meanwhile, whose timeout still fires)."""
        t, _, lane, ev = heapq.heappop(self.heap)
        ev.callbacks = None
        self._now = t
        self.state.fast_now = t
        cur = self.current[lane]
        if cur is None or cast(object, cur[4]) is not ev:   # aborted: the lane has moved on
            return t, None
        u, cls, start, dur, _ = cur
        self.current[lane] = None
        self.busy_s += dur
        self.inflight_count -= 1
        wev = u.event
        self.on_land(u, cls, lane, start, dur)
        if wev is not ev and wev is not None and wev.callbacks is not None:
            wev.callbacks = None   # a waiter's event: succeeded now (scheduled behind this instant's landings)
            self.q += 1
        self._next(lane)
        return t, u

    def advance(self, T: float) -> None:
        """A GPU timeout to ``T``, created now: every landing SimPy processes before it, then the
        clock moves to ``T``."""
        g = self.q
        self.q += 1
        heap = self.heap
        while heap and (heap[0][0] < T or (heap[0][0] == T and heap[0][1] < g)):
            self.land()
        self._now = T
        self.state.fast_now = T

    def flush(self, t: float) -> None:
        """The GPU resumes through an event scheduled at ``t`` now: the landings due at ``t``
        come first."""
        heap = self.heap
        self.q += 1
        while heap and heap[0][0] <= t:
            self.land()
        self._now = t
        self.state.fast_now = t

    def stalled(self) -> None:
        """Nothing is scheduled while the GPU waits: as the event loop reports it."""
        from moesim.sim.engine.transfers import PolicyError
        st = self.state
        raise PolicyError(f"the simulation stalled at iteration {st.cur_iter.index}, layer {st.cur_layer}: the GPU "
                          f"waits for an event that nothing will trigger (policy {st.policy.name!r})")

    def wait_one(self, u: Any) -> None:
        """The GPU waits for ``u`` (queued or in flight) to land."""
        ev = u.event
        if ev is None:   # queued: a waiter's event, succeeded by the landing
            ev = u.event = Ev([GPU])
            direct = False
        else:
            assert ev.callbacks is not None
            ev.callbacks.append(GPU)
            cur = self.flight(u)
            direct = cur is not None and cur[3] is ev   # in flight, and this is its timeout
        while u.state != RESIDENT:
            if not self.heap:
                self.stalled()
            t, _ = self.land()
        if direct:   # it resumes right after the landing's own callback
            self._now = t
            self.state.fast_now = t
        else:
            self.flush(t)

    def wait_any(self, units: list[Any]) -> None:
        """The GPU waits for the first of ``units`` (several, queued or in flight) to land,
        through an event scheduled after that landing."""
        for u in units:
            ev = u.event
            if ev is None:
                u.event = Ev([GPU])
            else:
                ev.callbacks.append(GPU)
        while True:
            if not self.heap:
                self.stalled()
            t, v = self.land()
            if v is not None and any(v is u for u in units):
                break
        self.flush(t)

    def wait_all(self, units: list[Any], condition: bool = False) -> None:
        """The GPU waits for every one of ``units`` to land: through a condition event (as
        ``env.all_of``), or on the one unit's own event when there is one and not ``condition``."""
        if len(units) == 1 and not condition:
            self.wait_one(units[0])
            return
        for u in units:
            ev = u.event
            if ev is None:
                u.event = Ev([GPU])
            else:
                ev.callbacks.append(GPU)
        t = self._now
        while any(u.state != RESIDENT for u in units):
            if not self.heap:
                self.stalled()
            t, _ = self.land()
        self.flush(t)

    def wait_room(self, tx: Transfers) -> None:
        """The GPU waits for room (``tx.space_event``, succeeded by a landing or what it set off)."""
        while not tx.space_event.triggered:
            if not self.heap:
                self.stalled()
            t, _ = self.land()
        self.flush(t)

    def finish(self, now: float) -> None:
        """The GPU stream ends at ``now``: SimPy processes every landing due by then first."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            self.land()
        self._now = now
        self.state.fast_now = now
