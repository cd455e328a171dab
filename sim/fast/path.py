"""The fast path: SimPy-free replays with the event loop's exact metrics and step records.

Every run whose options and fields the fast replays declare (:mod:`moesim.sim.fast.refusal`:
they fail closed) and which starts with no transfer under way is replayed without SimPy: by the
driver (:mod:`moesim.sim.fast.driver`: the event loop's own GPU stream,
:mod:`moesim.sim.engine.layer_loop`, with the run's own policy and transfers, its waits done by
arithmetic over an n-lane copy model), or, where the run's policy is one
cache rule that declares a kernel and the run suits it, by that kernel, which gives the same
outputs faster: the demand-only cache rules that declare a decider (:mod:`moesim.sim.fast.order`,
``static``:
:mod:`moesim.sim.fast.static`) and the next-layer prefetcher (:mod:`moesim.sim.fast.prefetch`,
eligibility in :mod:`moesim.sim.fast.prefetch_check`).

The engine takes this path only when :func:`fast_path_refusal` returns None and reports which
replay ran (``engine_path`` in the metrics: ``fast`` for the driver, ``fast (K kernel)`` for a
kernel). ``tests/test_fastpath.py``, ``tests/test_fastdriver.py`` and
``tests/test_fastprefetch.py`` compare them with the event loop on random traces.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from moesim.policies.contract.base import RESIDENT
from moesim.sim.fast.driver import drive
from moesim.sim.fast.order import ordered_kind, replay_ordered
from moesim.sim.fast.prefetch import replay_prefetch
from moesim.sim.fast.prefetch_check import is_prefetch_policy, prefetch_refusal, prefetch_source
from moesim.sim.fast.refusal import undeclared
from moesim.sim.fast.static import static_refusal, static_sets

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def fast_path_refusal(state: RunState[Transfers]) -> str | None:
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


def kernel_of(state: RunState[Transfers]) -> str | None:
    """The kernel that replays ``state``'s run (accepted by :func:`fast_path_refusal`): its
    name (a cache rule's decider's, e.g. ``lru`` or ``static``; ``next-layer``), or
    None for the driver. A cache kernel needs every layer's demand loads to find room at once:
    each pool holds as many experts as one layer of an iteration can run."""
    policy = state.policy
    if any(u.state != RESIDENT for u in state.vram.units.values()) or state.vram.draining_any():
        return None   # the run starts with copies under way: the kernels start from rest
    if is_prefetch_policy(state):
        return "next-layer" if prefetch_refusal(state) is None else None
    if state.check_invariants or policy.uses_hook("on_loaded"):
        return None
    statics = static_sets(state)
    if statics is not None:
        if static_refusal(state, statics) is not None:
            return None
    elif not policy.demand_only():
        return None
    per_pool = min(state.vram.capacity) // state.expert_bytes
    widest = max((it.n_tokens for it in state.workload.iterations), default=0)
    if min(widest * state.K, state.E) > per_pool:
        return None
    return ordered_kind(state)


def run_fast(state: RunState[Transfers]) -> None:
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
            return
        state.path = f"fast ({state.policy.name if kind == 'next-layer' else kind} kernel)"
        if kind == "next-layer":
            source = prefetch_source(state)
            assert source is not None
            replay_prefetch(state, source)
        else:
            replay_ordered(state, int(state.cost.hardware.copy_engines))
    finally:
        if collect:
            gc.enable()


class FastPath:
    """The fast path as the engine's :class:`~moesim.sim.engine.replay.FastReplay`: the
    driver and the kernels of this package, chosen per run by :func:`kernel_of`."""

    def refusal(self, state: RunState[Transfers]) -> str | None:
        """Why ``state``'s run cannot take the fast path, or None when it can."""
        return fast_path_refusal(state)

    def run(self, state: RunState[Transfers]) -> None:
        """Replay ``state``'s whole workload on the fast path."""
        run_fast(state)


FAST_PATH = FastPath()
"""The one fast replay; pass it as ``Engine(..., fast_replay=FAST_PATH)``."""
