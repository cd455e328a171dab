"""Copy lanes: transfers between host and device memory, served by ``n_lanes`` copy engines.

Two queue disciplines (``pcie.order`` in a scenario):

* ``priority`` (default): demand loads (class 0) go ahead of every queued prefetch (class 1);
  among prefetches a higher ``priority`` goes first, then first come first served. Queued
  transfers can be withdrawn or re-prioritised.
* ``fifo``: one copy stream, as CUDA stream order gives: transfers start in the order they were
  issued, whatever their class; an issued copy can be neither reordered nor withdrawn, so a
  demand load waits behind every prefetch issued before it.

Either way a transfer that has started runs to its end, unless the engine aborts it
(:meth:`CopyLanes.abort`, under priority order only): its lane then frees at once for the next
queued transfer. The lanes are driven by SimPy callbacks rather than processes: a transfer is
one ``env.timeout`` whose callback lands it and starts the next queued one (one event per
transfer; an aborted transfer's timeout still fires, and its callback finds the lane moved on).
That timeout, and the success of a waiter's own landing event, are built inline as SimPy 4.1's
``env.timeout`` and ``Event.succeed`` build them (``Environment._queue`` and ``._eid``;
``pyproject.toml`` pins ``simpy<4.2``, ``tests/test_lanes_simpy.py`` checks both against SimPy's).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal, Protocol

import simpy
from simpy.events import NORMAL, PENDING, Timeout

DEMAND_CLASS, PREFETCH_CLASS = 0, 1
ORDERS = ("priority", "fifo")
_new_timeout = Timeout.__new__   # a Timeout without its __init__ (CopyLanes._start sets its fields)


class Transfer(Protocol):
    """What the lanes need of a unit: its size, state and optional landing event."""

    nbytes: int
    state: int
    event: simpy.Event | None
    key: Any


class CopyLanes:
    """``n_lanes`` concurrent copy engines over one shared queue.

    ``duration(nbytes)`` gives a transfer's time (a pure function of the size: it is cached); ``on_start(unit, cls, lane)`` and
    ``on_land(unit, cls, lane, start, duration)`` let the engine keep its books. ``queued`` and
    ``inflight`` are the unit states the lanes set; the engine owns every other state.
    """

    def __init__(
        self,
        env: simpy.Environment,
        n_lanes: int,
        duration: Callable[[int], float],
        on_start: Callable[[Any, int, int], None],
        on_land: Callable[[Any, int, int, float, float], None],
        *,
        queued: int,
        inflight: int,
        order: Literal["priority", "fifo"] = "priority",
    ) -> None:
        if n_lanes < 1:
            raise ValueError(f"need at least one copy lane, got {n_lanes}")
        if order not in ORDERS:
            raise ValueError(f"unknown copy order {order!r} (priority or fifo)")
        self.env = env
        self.duration = duration
        self.on_start = on_start
        self.on_land = on_land
        self.QUEUED, self.INFLIGHT = queued, inflight
        self.fifo = order == "fifo"
        self.queue: list[tuple[int, float, int, Any, int]] = []   # (class, -priority, seq, unit, class)
        self.idle = list(range(n_lanes - 1, -1, -1))   # free lanes, lowest id popped first
        self.busy_s = 0.0
        self.inflight_count = 0
        # per lane, the transfer it runs: (unit, class, start, duration, timeout event), or None
        self.current: list[tuple[Any, int, float, float, simpy.Event] | None] = [None] * n_lanes
        self._seq = 0
        self._dur: dict[int, float] = {}   # duration by size (``duration`` is a pure function of it)
        # per lane, the callback of its transfer's timeout
        self._land_cb = [partial(self._on_timeout, lane) for lane in range(n_lanes)]

    def submit(self, unit: Any, cls: int, priority: float = 0.0) -> None:
        """Queue ``unit``; it starts at once if a lane is free."""
        seq = self._seq = self._seq + 1
        unit.state = self.QUEUED
        if self.idle:   # a free lane: the queue holds nothing (a lane idles only once it ran dry)
            self._start(unit, cls, self.idle.pop())
            return
        heapq.heappush(self.queue, (0, 0.0, seq, unit, cls) if self.fifo else (cls, -priority, seq, unit, cls))

    def _next(self, lane: int) -> None:
        queue = self.queue
        queued = self.QUEUED
        heappop = heapq.heappop
        while queue:
            _, _, _, u, cls = heappop(queue)
            if u.state == queued:   # else withdrawn meanwhile
                self._start(u, cls, lane)
                return
        self.idle.append(lane)

    def _start(self, u: Any, cls: int, lane: int) -> None:
        """``u``'s transfer starts on ``lane``: one timeout (``env.timeout(dur)``, built inline as
        SimPy's ``Timeout.__init__`` and ``Environment.schedule`` would) whose callback lands it."""
        u.state = self.INFLIGHT
        nbytes = u.nbytes
        dur = self._dur.get(nbytes)
        if dur is None:
            dur = self._dur[nbytes] = self.duration(nbytes)
        env = self.env
        start = env._now   # env.now without the property call
        self.inflight_count += 1
        self.on_start(u, cls, lane)
        ev = _new_timeout(Timeout)
        ev.env = env
        ev.callbacks = [self._land_cb[lane]]
        ev._value = None
        ev._delay = dur
        ev._ok = True
        heapq.heappush(env._queue, (env._now + dur, NORMAL, next(env._eid), ev))
        self.current[lane] = (u, cls, start, dur, ev)
        if u.event is None:
            u.event = ev   # whoever waits for the unit from now on waits for this timeout

    def _on_timeout(self, lane: int, ev: simpy.Event) -> None:
        cur = self.current[lane]
        if cur is None or cur[4] is not ev:   # aborted: the lane has moved on
            return
        u, cls, start, dur, _ = cur
        self.current[lane] = None
        self.busy_s += dur
        self.inflight_count -= 1
        wev = u.event
        self.on_land(u, cls, lane, start, dur)
        # a waiter made its own event while it was queued; wev._value is PENDING: not
        # wev.triggered; it succeeds as Event.succeed() does, without the calls
        if wev is not None and wev._value is PENDING:
            wev._ok = True
            wev._value = None
            env = self.env
            heapq.heappush(env._queue, (env._now, NORMAL, next(env._eid), wev))
        queue = self.queue   # self._next(lane), inlined (once per transfer)
        while queue:
            _, _, _, u, cls = heapq.heappop(queue)
            if u.state == self.QUEUED:   # else withdrawn meanwhile
                self._start(u, cls, lane)
                return
        self.idle.append(lane)

    @property
    def can_withdraw(self) -> bool:
        """Queued transfers may be withdrawn or re-prioritised (not under fifo order)."""
        return not self.fifo

    def cancel(self, keep: Callable[[Any, int], bool]) -> list[Any]:
        """Withdraw queued transfers for which ``keep(unit, cls)`` is False; returns them.
        Under fifo order nothing is withdrawn."""
        if self.fifo:
            return []
        kept: list[tuple[int, float, int, Any, int]] = []
        dropped: list[Any] = []
        for entry in self.queue:
            u, cls = entry[3], entry[4]
            if u.state == self.QUEUED and not keep(u, cls):
                dropped.append(u)
            else:
                kept.append(entry)
        if dropped:
            heapq.heapify(kept)
            self.queue = kept
        return dropped

    def flight(self, unit: Any) -> tuple[int, float, float, simpy.Event] | None:
        """(lane, start, duration, timeout event) of ``unit``'s transfer in flight, or None."""
        for lane, cur in enumerate(self.current):
            if cur is not None and cur[0] is unit:
                return lane, cur[2], cur[3], cur[4]
        return None

    def abort(self, unit: Any) -> float:
        """Stop ``unit``'s transfer in flight now (priority order only; the caller checked
        :meth:`flight`): its lane counts the time it ran and starts the next queued transfer at
        once; the transfer's timeout, still scheduled, is ignored when it fires. Returns the
        seconds it ran. The caller sets the unit's state."""
        assert not self.fifo, "an issued copy cannot be aborted under fifo order"
        found = self.flight(unit)
        assert found is not None, "abort of a transfer that is not in flight"
        lane, start, _, _ = found
        ran = self.env._now - start
        self.current[lane] = None
        self.busy_s += ran
        self.inflight_count -= 1
        self._next(lane)
        return ran

    def reprioritize(self, unit: Any, priority: float) -> bool:
        """Give a queued prefetch a new priority; False if it is not queued (or under fifo)."""
        if self.fifo or unit.state != self.QUEUED:
            return False
        queue = self.queue
        for i, e in enumerate(queue):   # each entry unpacked only where it is the unit's
            if e[3] is unit and e[4] != DEMAND_CLASS:
                if e[1] != -priority:   # (an unchanged entry leaves the heap as heapify would: as it is)
                    queue[i] = (e[0], -priority, e[2], unit, e[4])
                    heapq.heapify(queue)
                return True
        return False

    def queued_units(self) -> Iterable[Any]:
        """Units still waiting for a lane."""
        return (e[3] for e in self.queue if e[3].state == self.QUEUED)

    @property
    def busy(self) -> bool:
        """Some transfer is queued or in flight."""
        return self.inflight_count > 0 or any(True for _ in self.queued_units())
