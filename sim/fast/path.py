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
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import HIT, INFLIGHT, MISS, QUEUED, Outcome
from moesim.sim.engine.lanes import DEMAND_CLASS
from moesim.sim.engine.plans import access_order, check_plan, count_lossy
from moesim.sim.engine.records import STEP_CHUNK
from moesim.sim.engine.splits import apply_fractions
from moesim.sim.engine.transfers import PolicyError
from moesim.sim.engine.vram import Unit
from moesim.sim.fast.loads import compute_with_loads
from moesim.sim.fast.order import finish_iteration, ordered_kind, replay_ordered
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


def _replay(state: RunState[Transfers], n_lanes: int) -> None:  # noqa: C901 - one loop, kept flat for speed
    cost = state.cost
    L = state.L
    st = state.stats
    policy = state.policy
    view = state.view
    vram = state.vram
    tx = state.transfers
    units = vram.units
    pinned = vram.pinned
    caps0 = list(vram.capacity)
    steps = state.steps
    step_rows = steps.rows if state.record_steps else None   # appended inline (see StepRecords)
    iters = state.workload.iterations
    n_iters = len(iters)
    trace_experts = state.trace.experts
    batch_start: dict[int, float] = {}
    exp_cost: dict[int, float] = {}
    dur_of: dict[int, float] = {}
    has_start = policy.uses_hook("on_iteration_start")
    has_before = policy.uses_hook("before_layer")
    has_access = policy.uses_hook("on_access")
    has_after = policy.uses_hook("after_layer")
    has_end = policy.uses_hook("on_layer_end")
    has_iend = policy.uses_hook("on_iteration_end")
    has_routed = policy.uses_hook("on_routed")   # a demand-only policy's plans only substitute or drop
    lossy = policy.lossy
    global_pool = state.global_pool
    overhead_layer = cost.overhead_layer_s()
    transfer_s = cost.transfer_s
    expert_bytes = state.expert_bytes
    check = state.check_invariants
    splits = policy.uses_hook("part_fractions")
    progress = state.progress
    now = 0.0

    def no_cpu(where: str) -> None:
        if state.spent_s:
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but spent CPU time in {where}")

    for it in iters:
        state.cur_iter = it
        tx.iteration = it.index
        state.cur_layer = -1
        state.routed_upto = -1
        st.start_iteration(it, now, batch_start)
        state.fast_now = now
        if has_start:
            policy.on_iteration_start(view)
            no_cpu("on_iteration_start")
        n_tok = it.n_tokens
        layer_s = cost.layer_s(n_tok)
        step_s = layer_s + overhead_layer
        single = n_tok == 1
        row0 = int(it.rows0[0]) if single else 0
        for layer in range(L):
            state.cur_layer = layer
            tx.layer_evictions = 0
            t0 = now
            if has_before:
                state.fast_now = now
                policy.before_layer(view, layer)
                if state.spent_s:
                    no_cpu("before_layer")
            now = now + step_s
            st.gpu_busy_s += layer_s
            st.overhead_s += overhead_layer
            state.routed_upto = layer
            routing = None
            plan_m = None
            if has_routed:
                state.fast_now = now
                routing = state.routing_of(it, layer)
                plan = policy.on_routed(view, layer, routing)
                if state.spent_s:
                    no_cpu("on_routed")
                if plan is not None:
                    if plan.wait_for or (plan.on_cpu is not None and np.asarray(plan.on_cpu, dtype=bool).any()):
                        raise PolicyError(f"policy {policy.name!r} declares itself demand-only but planned "
                                          "CPU slots or waits for copies")
                    plan_m = check_plan(plan, routing, policy_name=policy.name, lossy=lossy,
                                        num_experts=state.E, iteration=it.index, layer=layer)
                if lossy:
                    count_lossy(st, routing, plan_m)
            elif lossy:
                routing = state.routing_of(it, layer)
                count_lossy(st, routing, None)
            if plan_m is not None:
                if single:
                    exps = [x for x in plan_m.tolist()[0] if x >= 0]
                    counts = [1] * len(exps)
                else:
                    flat = plan_m.reshape(-1)
                    exps, counts = access_order(flat[flat >= 0])
            elif single:
                exps = [x for x in trace_experts[row0 + layer].tolist() if x >= 0]
                counts = [1] * len(exps)
            else:
                flat = trace_experts[it.rows0 + layer].reshape(-1)
                exps, counts = access_order(flat[flat >= 0])
            status: list[int] = []
            need: list[tuple[float, Any]] = []
            miss_units: list[Any] = []
            hits = miss = miss_bytes = 0
            keys = [(layer, e, 0) for e in exps]
            pinned.update(keys)
            for i, key in enumerate(keys):
                c = counts[i]
                t_exp = exp_cost.get(c)
                if t_exp is None:
                    t_exp = exp_cost[c] = cost.expert_s(c)
                u = units.get(key)
                if u is None:
                    u = Unit(key, expert_bytes, 0 if global_pool else layer, True)
                    vram.add(u)
                    miss_units.append(u)
                    miss_bytes += expert_bytes
                    status.append(MISS)
                    miss += 1
                else:
                    status.append(HIT)
                    hits += 1
                if not u.used:
                    st.fetch_needed += 1
                    if not u.demand:   # a warm-start unit is marked used; nothing else prefetches
                        st.fetch_covered += 1
                        st.prefetch_used += 1
                    u.used = True
                need.append((t_exp, u))
            st.hits += hits
            st.misses += miss
            stall = 0.0
            if miss_units:
                tx.waiting.extend(miss_units)
                granted, delay = tx.grant_waiting()
                if tx.waiting:
                    raise PolicyError(f"policy {policy.name!r} declares itself demand-only but refused "
                                      f"every victim for a demand load at iteration {it.index}, layer {layer}")
                if delay > 0:
                    now = now + delay
                stall += delay
                for j, u in enumerate(granted):
                    u.state = INFLIGHT if j < n_lanes else QUEUED
                    tx.count_start(u, DEMAND_CLASS, j % n_lanes)
            if has_access or has_after:
                state.fast_now = now
                if routing is None:
                    routing = state.routing_of(it, layer)
                outcome = Outcome(layer, routing, routing.experts if plan_m is None else plan_m, exps, status, [])
                if has_access:
                    policy.on_access(view, layer, outcome)
                if has_after:
                    policy.after_layer(view, layer, outcome)
                if state.spent_s:
                    no_cpu("on_access/after_layer")
            if not miss_units:
                dt = sum([x[0] for x in need])
                now = now + dt
                st.gpu_busy_s += dt
            else:
                now, stall = compute_with_loads(st, need, miss_units, n_lanes, now, stall,
                                                 transfer_s, dur_of)
            pinned.difference_update(keys)
            st.stall_s += stall
            if has_end:
                state.fast_now = now
                policy.on_layer_end(view, layer)
                if state.spent_s:
                    no_cpu("on_layer_end")
            if check:
                vram.check()
            if step_rows is not None:   # StepRecords.append, inlined
                step_rows.append((it.index, layer, t0, t0 + step_s, now, len(exps), hits, 0, 0, miss, 0,
                                  stall, miss_bytes, 0, tx.layer_evictions))
                if len(step_rows) >= STEP_CHUNK:
                    steps.pack()
                    step_rows = steps.rows
        now = finish_iteration(st, cost, it, n_tok, now)
        state.cur_layer = L
        state.fast_now = now
        if has_iend:
            policy.on_iteration_end(view)
            no_cpu("on_iteration_end")
        if vram.capacity != caps0:
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but changed the layer budgets")
        if splits:
            apply_fractions(state)
        if any(len(fr) != 1 for fr in state.fractions):
            raise PolicyError(f"policy {policy.name!r} declares itself demand-only but split experts into parts")
        state.prev_iter = it
        if progress is not None:
            progress(it.index + 1, n_iters)
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
