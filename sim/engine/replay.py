"""The seam between the event loop and the exact SimPy-free replays (:mod:`moesim.sim.fast`).

The engine knows no kernel: whoever builds an :class:`~moesim.sim.engine.event_loop.Engine`
(the runner, :mod:`moesim.sim.run.runner`) hands it a :class:`FastReplay` or None. After the
policy's ``setup`` and the initial fill the engine asks the replay whether it reproduces the
run exactly; if it does, the replay runs the whole workload on the run's state, else the event
loop does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


class FastReplay(Protocol):
    """A replay of the whole workload that gives the event loop's metrics and step records
    bit for bit, for the runs it accepts."""

    def refusal(self, run: RunState[Transfers]) -> str | None:
        """Why this replay cannot reproduce ``run`` exactly, or None when it can."""
        ...

    def run(self, run: RunState[Transfers]) -> None:
        """Replay the whole workload, leaving the run's counters, records and clock as the
        event loop would."""
        ...
