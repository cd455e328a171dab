"""The seam between the event loop and the exact SimPy-free replays (:mod:`moesim.sim.fast`).

The engine knows no kernel: whoever builds an :class:`~moesim.sim.engine.event_loop.Engine`
(the runner, :mod:`moesim.sim.run.runner`) hands it a :class:`FastReplay` or None. After the
policy's ``setup`` and the initial fill the engine asks the replay whether it reproduces this
run exactly; if it does, the replay runs the whole workload, else the event loop does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from moesim.sim.engine.event_loop import Engine


class FastReplay(Protocol):
    """A replay of the whole workload that gives the event loop's metrics and step records
    bit for bit, for the runs it accepts."""

    def refusal(self, engine: Engine) -> str | None:
        """Why this replay cannot reproduce ``engine``'s run exactly, or None when it can."""
        ...

    def run(self, engine: Engine) -> None:
        """Replay the whole workload, leaving the engine's counters, records and clock as the
        event loop would."""
        ...
