"""CopyLanes builds each transfer's timeout, and succeeds a waiter's landing event, inline
(sim/engine/lanes.py): the heap entries and events must be the ones SimPy's own
``env.timeout`` and ``Event.succeed`` make (``simpy<4.2`` is pinned for this), so that every
tie between a landing and other events resolves as in SimPy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import simpy

from moesim.sim.engine.lanes import DEMAND_CLASS, CopyLanes


@dataclass
class _U:
    nbytes: int
    key: Any
    state: int = 0
    event: simpy.Event | None = None


def _lanes(env: simpy.Environment, log: list[tuple[str, float]]) -> CopyLanes:
    return CopyLanes(env, 1, lambda n: n / 1000.0, lambda u, c, lane: None,
                     lambda u, c, lane, s, d: log.append((f"land {u.key}", env.now)), queued=1, inflight=2)


def test_inline_timeout_is_simpys() -> None:
    env = simpy.Environment()
    lanes = _lanes(env, [])
    ref = env.timeout(2.0)
    u = _U(2000, "a")
    lanes.submit(u, DEMAND_CLASS)
    assert u.event is not None and type(u.event) is type(ref)
    entries = sorted(env._queue)
    assert [(t, prio) for t, prio, _, _ in entries] == [(2.0, 1), (2.0, 1)]   # NORMAL priority
    assert entries[0][3] is ref and entries[1][3] is u.event                 # ids in creation order
    for name in ("_delay", "_ok", "_value", "env"):
        assert getattr(u.event, name) == getattr(ref, name), name
    assert u.event.triggered and ref.triggered and u.event.callbacks is not None   # scheduled, not yet processed


def test_ties_resolve_in_creation_order_and_waiters_wake() -> None:
    """A copy landing at the instant another event is due: the earlier-created runs first; a
    waiter that made its own event while the copy was queued is woken right after the landing."""
    env = simpy.Environment()
    log: list[tuple[str, float]] = []
    lanes = _lanes(env, log)
    first = _U(1000, "a")
    lanes.submit(first, DEMAND_CLASS)                 # lands at 1.0
    tick = env.timeout(1.0)                           # due at 1.0, created after the copy
    tick.callbacks.append(lambda _e: log.append(("tick", env.now)))
    queued = _U(1000, "b")
    lanes.submit(queued, DEMAND_CLASS)                # waits for the lane: lands at 2.0
    assert queued.event is None
    queued.event = env.event()                        # a waiter's own event, made while queued

    def waiter() -> Any:
        yield queued.event
        log.append(("woken", env.now))

    env.process(waiter())
    env.run()
    assert log == [("land a", 1.0), ("tick", 1.0), ("land b", 2.0), ("woken", 2.0)]
