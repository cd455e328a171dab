"""The executor's implementation of :class:`moesim.policies.contract.base.View`: the simulator's causal
view (:class:`moesim.sim.engine.view.EngineView`, the same reads and the same actions) over the
executor's state, with ``now`` in wall-clock seconds since the run started and the actions
going to the executor, which keeps the simulator's VRAM rules and issues real copies."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from moesim.sim.engine.view import EngineView

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.real.executor.runner import Executor


class ExecutorView(EngineView):
    """What a policy may see and do in a real run (see :class:`moesim.policies.contract.base.View`)."""

    __slots__ = ()

    def __init__(self, executor: Executor) -> None:
        super().__init__(executor)  # type: ignore[arg-type]  # the executor has the engine's fields

    @property
    def now(self) -> float:
        """Wall-clock seconds since the run started."""
        return time.perf_counter() - self._e.t_origin  # type: ignore[attr-defined]
