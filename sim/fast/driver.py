"""The SimPy-free driver: the GPU stream of :mod:`moesim.sim.engine.layer_loop` (the loop the
event loop runs too) with its waits done by arithmetic on a
:class:`~moesim.sim.fast.copies.Clock` (its :class:`~moesim.sim.engine.layer_loop.Waits`), whose
:class:`~moesim.sim.fast.copies.FastLanes` replace the run's SimPy copy lanes: the run's own
:class:`~moesim.sim.engine.transfers.Transfers` (room, victims, prefetches, withdrawals and
aborts), policy and view, and the lanes' landings ordered by (time, creation order) as SimPy
orders them. Every wait is over when the clock returns, so the stream never suspends.

It takes every policy, prefetching ones included, on the runs the fast path accepts
(:meth:`~moesim.sim.fast.path.FastPath.refusal`: every option and field declared), serving
runs included (the run's scheduler forms each iteration at the driver's clock, and an idle GPU
waits for the next arrival with the stream's ``run_for``: ``tests/test_fastdriver_serving.py``); the cache
kernels (:mod:`moesim.sim.fast.order`, :mod:`moesim.sim.fast.prefetch`) stand in for it where a
policy is one of their rules. ``tests/test_fastdriver.py`` compares it with the event loop for
every shipped policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moesim.sim.engine.layer_loop import gpu_stream
from moesim.sim.fast.copies import Clock, FastLanes

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def drive(run: RunState[Transfers]) -> None:
    """Replay ``run``'s whole workload (see the module docstring); leaves its counters, step
    records and clock (``run.fast_now``) as the event loop would, its transfers on the fast lanes."""
    tx = run.transfers
    saved, saved_d2h = tx.lanes, tx.d2h
    clock = Clock(run)
    tx.lanes, tx.d2h = tx.new_lanes(FastLanes, clock, "priority" if saved.can_withdraw else "fifo",
                                    saved_d2h is not None)   # cache.swap_out: a device-to-host lane
    pairs = [(saved, tx.lanes)]
    if saved_d2h is not None and tx.d2h is not None:
        pairs.append((saved_d2h, tx.d2h))
    clock.adopt(tx.env, pairs)   # copies a policy issued while it warmed up
    run.fast_now = 0.0
    for _ in gpu_stream(run, clock, clock):   # the fast lanes stay the run's: they hold its state at the end
        raise AssertionError("the SimPy-free clock waits at once: the GPU stream never suspends")
    clock.flush(clock._now)   # the stream ends: SimPy processes every landing due by then first
