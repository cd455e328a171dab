"""timeout_unless_alone: the GPU process skips its own timeout only when no event could run meanwhile."""

from __future__ import annotations

import simpy

from moesim.sim.engine.clock import timeout_unless_alone


def _trace(skip: bool) -> list[tuple[str, float]]:
    """A process computing 1 s, 2 s, 1 s while a 'landing' at t=3 and one at t=5 fire; with
    ``skip`` the process advances alone where it can."""
    env = simpy.Environment()
    log: list[tuple[str, float]] = []
    for t in (3.0, 5.0):
        ev = env.timeout(t)
        ev.callbacks.append(lambda _e: log.append(("land", env.now)))

    def gpu() -> object:
        for dt in (1.0, 2.0, 1.0, 1.0):
            ev = timeout_unless_alone(env, dt) if skip else env.timeout(dt)
            if ev is not None:
                yield ev
            log.append(("done", env.now))

    env.run(until=env.process(gpu()))
    return log


def test_skips_only_when_nothing_is_due_and_keeps_the_order_of_ties() -> None:
    env = simpy.Environment()
    assert timeout_unless_alone(env, 2.5) is None and env.now == 2.5      # empty queue: the clock moves
    env.timeout(1.0)                                                      # due at 3.5
    tie = timeout_unless_alone(env, 1.0)                                  # a tie: the caller must yield
    assert isinstance(tie, simpy.Timeout) and tie._delay == 1.0 and env.now == 2.5
    assert timeout_unless_alone(env, 2.0) is not None and env.now == 2.5  # due before: must yield
    assert timeout_unless_alone(env, 0.5) is None and env.now == 3.0      # due after: moves
    # a whole run gives the same log either way, the landing at t=3 before the compute ending at 3
    assert _trace(True) == _trace(False) == [("done", 1.0), ("land", 3.0), ("done", 3.0),
                                             ("done", 4.0), ("land", 5.0), ("done", 5.0)]
