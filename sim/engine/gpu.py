"""The GPU stream of the event loop (the reference replay): the one loop of
:mod:`moesim.sim.engine.layer_loop` run as a SimPy process, its waits made SimPy events: compute
as timeouts (none when nothing else can happen meanwhile: :func:`~moesim.sim.engine.clock.timeout_unless_alone`),
copies landing as the lanes' events, room as the transfers' ``space_event``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import simpy

from moesim.sim.engine.clock import timeout_unless_alone
from moesim.sim.engine.layer_loop import Stream, gpu_stream

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers
    from moesim.sim.engine.vram import Unit


class SimPyWaits:
    """The GPU stream's waits (:class:`~moesim.sim.engine.layer_loop.Waits`) as SimPy events on
    ``env``, the copies' landings those of the transfers ``tx``."""

    __slots__ = ("env", "tx", "landing", "land_one", "run_for")

    def __init__(self, env: simpy.Environment, tx: Transfers) -> None:
        self.env = env
        self.tx = tx
        self.landing = self.land_one = tx.landing   # a unit's landing event
        # a timeout of dt, or None when the clock moved there alone (a partial: one call per wait)
        self.run_for: Callable[[float], simpy.Event | None] = partial(timeout_unless_alone, env)

    def land_any(self, units: list[Unit]) -> simpy.Event:
        """An event that succeeds when the first landing of ``units`` (untriggered) is processed:
        what ``env.any_of`` gives, scheduled at the same instant and in the same order (one
        ``succeed`` from the first callback), without building a condition value."""
        any_ev = self.env.event()

        def fire(_ev: simpy.Event) -> None:
            if not any_ev.triggered:
                any_ev.succeed()

        landing = self.landing
        for u in units:
            ev = landing(u)
            assert ev.callbacks is not None   # not yet processed: the unit is queued or in flight
            ev.callbacks.append(fire)
        return any_ev

    def land_all(self, units: list[Unit]) -> simpy.Event:
        """``env.all_of`` the landings of ``units``."""
        landing = self.landing
        return self.env.all_of([landing(u) for u in units])

    def room(self) -> simpy.Event:
        """The transfers' ``space_event``."""
        return self.tx.space_event


def gpu_process(run: RunState[Transfers], env: simpy.Environment) -> Stream:
    """The GPU stream of ``run`` on ``env``, as a SimPy process (``env.process`` takes it)."""
    return gpu_stream(run, env, SimPyWaits(env, run.transfers))

