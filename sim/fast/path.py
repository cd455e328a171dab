"""The fast path: a SimPy-free replay for demand-only policies, with the event loop's exact
metrics.

When a policy only loads on demand (:meth:`~moesim.policies.contract.base.Policy.demand_only`: no
prefetch, no CPU time, no budget or split changes) and the run has nothing else that overlaps
(no ``swap_out``, no transfer buffer, no timeline, no synchronous prefetch), every transfer of
a layer is one of that layer's demand loads, all issued at one instant, and the layer ends when
the last of them has landed and computed. Nothing crosses a layer boundary, so each layer can
be replayed on its own with a handful of numbers instead of SimPy processes and events.

Exactness: the replay keeps the run's VRAM, transfers, counters and view (victims come from
the same :meth:`~moesim.sim.engine.transfers.Transfers.make_room`, with the same candidate order), and
advances time with the same floating-point operations in the same order as the event loop. The
one place where SimPy's order matters, a copy landing at exactly the instant an expert's
compute ends, is resolved as SimPy does: by the (time, creation order) of the two events.
``tests/test_fastpath.py`` compares both paths' metrics and step records on random traces for
every policy that declares itself demand-only.

Eligibility is decided by :func:`fast_path_refusal`; the engine takes this path only when it
returns None and reports which path ran (``engine_path`` in the metrics). A policy that declares
``demand_only`` but issues a prefetch or spends CPU time is stopped with one line.

The shipped next-layer prefetchers ``mixtral-offloading`` and ``oracle-prefetch`` are not
demand-only; their runs go to their own kernel (:mod:`moesim.sim.fast.prefetch`, eligibility in
:mod:`moesim.sim.fast.prefetch_check`), which replays prefetches crossing layers on one copy lane.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.contract.base import INFLIGHT, QUEUED
from moesim.sim.engine.lanes import DEMAND_CLASS
from moesim.sim.engine.step import Stepper
from moesim.sim.engine.transfers import PolicyError
from moesim.sim.fast.loads import compute_with_loads
from moesim.sim.fast.order import ordered_kind, replay_ordered
from moesim.sim.fast.prefetch import replay_prefetch
from moesim.sim.fast.prefetch_check import is_prefetch_policy, prefetch_refusal, prefetch_source
from moesim.sim.fast.refusal import replay_refusal
from moesim.sim.fast.static import static_refusal, static_sets

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def fast_path_refusal(state: RunState[Transfers]) -> str | None:
    """Why ``state``'s run cannot take the fast path, or None when it can (call after the
    policy's ``setup`` and the initial fill). The fast path is exact only when every layer's
    demand loads find room at once: each pool holds at least as many experts as one layer of an
    iteration can run (``min(tokens x top_k, experts)``)."""
    policy = state.policy
    if is_prefetch_policy(state):
        return prefetch_refusal(state)
    statics = static_sets(state)
    if statics is not None:
        why = static_refusal(state, statics)
        if why is not None:
            return why
        if state.cost.demand_load_s():
            return "static's kernel does not charge runtime.demand_load_us"
    elif not policy.demand_only():
        return f"policy {policy.name!r} is not demand-only"
    why = replay_refusal(state)
    if why is not None:
        return why
    if policy.uses_hook("on_loaded"):
        return "the policy reacts to landings"
    per_pool = min(state.vram.capacity) // state.expert_bytes
    widest = max((it.n_tokens for it in state.workload.iterations), default=0)
    if min(widest * state.K, state.E) > per_pool:
        return (f"a layer may run up to {min(widest * state.K, state.E)} experts but a pool "
                f"holds {per_pool} (demand loads could wait for room)")
    return None


def run_fast(state: RunState[Transfers]) -> None:
    """Replay ``state``'s whole workload on the fast path (see the module docstring). Leaves
    the run's counters, step records and clock (``state.fast_now``) as the event loop would."""
    n_lanes = int(state.cost.hardware.copy_engines)
    kind = None if state.check_invariants or is_prefetch_policy(state) else ordered_kind(state)
    # the replays allocate many short-lived lists and tuples and no reference cycles: the
    # cyclic collector's passes over the trace and the records would only cost time
    collect = gc.isenabled()
    gc.disable()
    try:
        if is_prefetch_policy(state):
            state.path = f"fast ({state.policy.name} kernel)"
            source = prefetch_source(state)
            assert source is not None
            replay_prefetch(state, source)
            return
        if kind is not None:
            state.path = f"fast ({kind} kernel)"
            replay_ordered(state, kind, n_lanes)
            return
        with state.transfers.demand_loads_only():
            _replay(state, n_lanes)
    finally:
        if collect:
            gc.enable()


def _replay(state: RunState[Transfers], n_lanes: int) -> None:
    """The generic demand-only replay: the step functions of :mod:`moesim.sim.engine.step`, time
    advanced by arithmetic (a layer's demand loads all issue at one instant and land within it:
    :func:`~moesim.sim.fast.loads.compute_with_loads`)."""
    step = Stepper(state)
    st = state.stats
    policy = state.policy
    view = state.view
    vram = state.vram
    tx = state.transfers
    caps0 = list(vram.capacity)
    transfer_s = state.cost.transfer_s
    dur_of: dict[int, float] = {}
    now = 0.0

    def no_cpu(where: str) -> None:
        if state.spent_s:
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but spent CPU time in {where}")

    for it in state.workload.iterations:
        now = step.begin_iteration(it, now)
        state.fast_now = now
        if step.has_start:
            policy.on_iteration_start(view)
            no_cpu("on_iteration_start")
        layer_s, over_s = step.non_moe_s(it)
        for layer in range(state.L):
            step.begin_layer(layer)
            t0 = now
            if step.has_before:
                state.fast_now = now
                policy.before_layer(view, layer)
                no_cpu("before_layer")
            now = now + (layer_s + over_s)
            state.fast_now = now
            ls = step.route(it, layer, t0, layer_s, over_s)
            no_cpu("on_routed")
            plan = ls.plan
            if plan is not None and (plan.wait_for or (plan.on_cpu is not None
                                                       and np.asarray(plan.on_cpu, dtype=bool).any())):
                raise PolicyError(f"policy {policy.name!r} declares itself demand-only but planned "
                                  "CPU slots or waits for copies")
            ls.t_route = now
            step.take_units(ls)
            miss_units = ls.miss_units
            if miss_units:
                tx.waiting.extend(miss_units)
                granted, delay = tx.grant_waiting()
                if tx.waiting:
                    raise PolicyError(f"policy {policy.name!r} declares itself demand-only but refused "
                                      f"every victim for a demand load at iteration {it.index}, layer {layer}")
                if delay > 0:
                    now = now + delay
                ls.stall += delay
                for j, u in enumerate(granted):
                    u.state = INFLIGHT if j < n_lanes else QUEUED
                    tx.count_start(u, DEMAND_CLASS, j % n_lanes)
            if step.has_access or step.has_after:
                state.fast_now = now
                step.notify(ls)
                no_cpu("on_access/after_layer")
            if not miss_units:
                dt = sum([x[1] for x in ls.need])
                now = now + dt
                st.gpu_busy_s += dt
            else:
                now, ls.stall = compute_with_loads(st, ls.need, miss_units, n_lanes, now, ls.stall,
                                                   transfer_s, dur_of)
            state.fast_now = now
            step.end_layer(ls, now)
            no_cpu("on_layer_end")
        head, over = step.tail_s(it)
        if head + over > 0:
            now = now + (head + over)
            step.count_tail(head, over)
        state.fast_now = now
        step.end_iteration(it, now)
        if step.has_iend:
            policy.on_iteration_end(view)
            no_cpu("on_iteration_end")
        if vram.capacity != caps0:
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but changed the layer budgets")
        step.close_iteration(it)
        if any(len(fr) != 1 for fr in state.fractions):
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but split experts into parts")
    state.fast_now = now


class FastPath:
    """The fast path as the engine's :class:`~moesim.sim.engine.replay.FastReplay`: the
    kernels of this package, chosen per run by :func:`fast_path_refusal`."""

    def refusal(self, state: RunState[Transfers]) -> str | None:
        """Why ``state``'s run cannot take the fast path, or None when it can."""
        return fast_path_refusal(state)

    def run(self, state: RunState[Transfers]) -> None:
        """Replay ``state``'s whole workload on the fast path."""
        run_fast(state)


FAST_PATH = FastPath()
"""The one fast replay; pass it as ``Engine(..., fast_replay=FAST_PATH)``."""
