"""Advancing SimPy's clock without an event when nothing else can happen meanwhile.

The GPU process spends most of its yields on fixed-length compute (a layer's non-MoE part, a
batch of experts, the head). ``yield env.timeout(dt)`` costs an event, a heap push and pop and a
generator resume. When no event is scheduled at or before ``now + dt``, nothing can run in
between and the process would resume at exactly ``now + dt`` as the very next step, so setting
the clock there and going on is the same simulation: same times (the same float ``now + dt``
SimPy computes), same order of every other event (event ids only order events of equal time,
and no scheduled event is at or before the new time; every later ``schedule`` keeps its order).
With an event due at ``now + dt`` or earlier the caller yields the timeout as before, so ties
resolve exactly as SimPy resolves them.

SimPy has no public API for this: :func:`timeout_unless_alone` reads ``Environment._now`` and
``_queue`` (a heap of ``(time, priority, id, event)``), which SimPy 4.1 has. ``pyproject.toml``
pins ``simpy<4.2`` so that a release that changes them cannot slip in unnoticed, and
``tests/test_clock.py`` checks the behaviour against plain timeouts.
"""

from __future__ import annotations

import simpy


def timeout_unless_alone(env: simpy.Environment, dt: float) -> simpy.Event | None:
    """The running process's timeout of ``dt`` seconds on ``env``: None when no scheduled event
    is due at or before its end, the clock having moved there; else the timeout, to yield. Only a
    running process may call it (it stands for that process's own timeout)."""
    end = env._now + dt
    queue = env._queue
    if queue and queue[0][0] <= end:
        return env.timeout(dt)
    env._now = end
    return None
