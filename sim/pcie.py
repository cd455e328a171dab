"""Host-to-device copy lanes: a priority queue of transfers served by ``copy_engines`` lanes.

Demand loads (class 0) go ahead of every prefetch (class 1); among prefetches a higher
``priority`` goes first, then first come first served. A transfer that has started runs to
its end: only queued ones can be cancelled.

The lanes are driven by SimPy callbacks rather than processes: a transfer is one
``env.timeout`` whose callback lands the unit and starts the next queued transfer. That costs
one event per transfer where a process would cost three (wake-up, timeout, completion), and
it is the engine's hottest path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol

import simpy

DEMAND_CLASS, PREFETCH_CLASS = 0, 1


class Transfer(Protocol):
    """What the lanes need of a unit: its size, state and optional landing event."""

    nbytes: int
    state: int
    event: simpy.Event | None
    key: Any


class CopyLanes:
    """``n_lanes`` concurrent H2D copy engines over one shared priority queue.

    ``duration(nbytes)`` gives a transfer's time; ``on_start(unit, cls, lane)`` and
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
    ) -> None:
        if n_lanes < 1:
            raise ValueError(f"need at least one copy lane, got {n_lanes}")
        self.env = env
        self.duration = duration
        self.on_start = on_start
        self.on_land = on_land
        self.QUEUED, self.INFLIGHT = queued, inflight
        self.queue: list[tuple[int, float, int, Any]] = []
        self.idle = list(range(n_lanes - 1, -1, -1))   # free lanes, lowest id popped first
        self.busy_s = 0.0
        self._seq = 0

    def submit(self, unit: Any, cls: int, priority: float = 0.0) -> None:
        """Queue ``unit``; it starts at once if a lane is free."""
        self._seq += 1
        unit.state = self.QUEUED
        heapq.heappush(self.queue, (cls, -priority, self._seq, unit))
        if self.idle:
            self._next(self.idle.pop())

    def _next(self, lane: int) -> None:
        queue = self.queue
        while queue:
            cls, _, _, u = heapq.heappop(queue)
            if u.state != self.QUEUED:   # cancelled meanwhile
                continue
            u.state = self.INFLIGHT
            dur = self.duration(u.nbytes)
            start = self.env.now
            self.on_start(u, cls, lane)
            ev = self.env.timeout(dur)
            assert ev.callbacks is not None
            ev.callbacks.append(partial(self._on_timeout, u, cls, lane, start, dur))
            if u.event is None:
                u.event = ev   # whoever waits for the unit from now on waits for this timeout
            return
        self.idle.append(lane)

    def _on_timeout(self, u: Any, cls: int, lane: int, start: float, dur: float, _ev: simpy.Event) -> None:
        self._land(u, cls, lane, start, dur)

    def _land(self, u: Any, cls: int, lane: int, start: float, dur: float) -> None:
        self.busy_s += dur
        ev = u.event
        self.on_land(u, cls, lane, start, dur)
        if ev is not None and not ev.triggered:   # a waiter made its own event while it was queued
            ev.succeed()
        self._next(lane)

    def cancel(self, keep: Callable[[Any, int], bool]) -> list[Any]:
        """Remove queued transfers for which ``keep(unit, cls)`` is False; returns them."""
        kept: list[tuple[int, float, int, Any]] = []
        dropped: list[Any] = []
        for entry in self.queue:
            u = entry[3]
            if u.state == self.QUEUED and not keep(u, entry[0]):
                dropped.append(u)
            else:
                kept.append(entry)
        if dropped:
            heapq.heapify(kept)
            self.queue = kept
        return dropped

    def queued_units(self) -> Iterable[Any]:
        return (e[3] for e in self.queue if e[3].state == self.QUEUED)
