"""The fast path: SimPy-free replays with the event loop's exact metrics and step records.

Every run whose options and fields the fast replays declare (:mod:`moesim.sim.fast.refusal`:
they fail closed) and which starts with no transfer under way is replayed without SimPy: by the
driver (:mod:`moesim.sim.fast.driver`: the event loop's own GPU stream,
:mod:`moesim.sim.engine.layer_loop`, with the run's own policy and transfers, its waits done by
arithmetic over an n-lane copy model), or, where the run's policy's parts declare a kernel and
the run suits it (:mod:`moesim.sim.fast.kernel_choice`), by that kernel, which gives the same
outputs faster: the demand-only cache rules that declare a decider, a warm ``static`` included
(:mod:`moesim.sim.fast.order`), and the next-layer prefetcher (:mod:`moesim.sim.fast.prefetch`).

The engine takes this path only when :meth:`FastPath.refusal` returns None and reports which
replay ran (``engine_path`` in the metrics: ``fast`` for the driver, ``fast (K kernel)`` for a
kernel). ``tests/test_fastpath.py``, ``tests/test_fastdriver.py`` and
``tests/test_fastprefetch.py`` compare them with the event loop on random traces.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from moesim.sim.fast.driver import drive
from moesim.sim.fast.kernel_choice import kernel_of
from moesim.sim.fast.order import replay_ordered
from moesim.sim.fast.prefetch import replay_prefetch
from moesim.sim.fast.refusal import undeclared

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


class FastPath:
    """The fast path as the engine's :class:`~moesim.sim.engine.replay.FastReplay`: the driver
    and the kernels of this package, chosen per run by
    :func:`~moesim.sim.fast.kernel_choice.kernel_of`."""

    def refusal(self, state: RunState[Transfers]) -> str | None:
        """Why ``state``'s run cannot take the fast path, or None when it can (call after the
        policy's ``setup``, the initial fill and ``warm``)."""
        why = undeclared(state)
        if why is not None:
            return why
        tx = state.transfers
        known = {id(tx.space_event)} | {id(cur[4]) for lanes in (tx.lanes, tx.d2h) if lanes is not None
                                        for cur in lanes.current if cur is not None}
        if tx.waiting or any(id(e[3]) not in known for e in tx.env._queue):   # pragma: no cover - warm() cannot
            return "the run starts with events the fast path does not take over (only copies under way)"
        return None

    def run(self, state: RunState[Transfers]) -> None:
        """Replay ``state``'s whole workload on the fast path (see the module docstring). Leaves
        the run's counters, step records and clock (``state.fast_now``) as the event loop would."""
        kind = kernel_of(state)
        # the replays allocate many short-lived lists and tuples and no reference cycles: the
        # cyclic collector's passes over the trace and the records would only cost time
        collect = gc.isenabled()
        gc.disable()
        try:
            if kind is None:
                drive(state)
            elif kind == "next-layer":
                state.path = f"fast ({state.policy.name} kernel)"
                replay_prefetch(state)
            else:
                state.path = f"fast ({kind} kernel)"
                replay_ordered(state, int(state.cost.hardware.copy_engines))
        finally:
            if collect:
                gc.enable()


FAST_PATH = FastPath()
"""The one fast replay; pass it as ``Engine(..., fast_replay=FAST_PATH)``."""
