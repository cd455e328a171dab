"""The cache kernel of the fast path: a cache rule that declares a decider (LRU, FIFO, LFU,
Random, Belady, a warm ``static``) replayed without policy objects, EvictionRequests,
candidate lists or unit objects, in two passes over blocks of iterations.

1. Decisions, by the rule's decider (:mod:`moesim.policies.parts.deciders`): which accesses of
   each step hit, which miss, how many residents each step evicts. A demand-only run never
   crosses layers, so most rules decide a layer at a time in a tight loop.
2. Timing: the steps in the event loop's order, with the same floating-point operations in the
   same order as the event loop. Every load is a whole expert and takes the same time, so a
   layer's timing needs only its hits' and misses' costs
   (:func:`~moesim.sim.fast.loads.compute_while_loading`); a one-token step's experts all cost
   the same, so only their counts (one miss, the common case, inline here).

The kernel keeps its own books (not :class:`~moesim.sim.engine.vram.Vram`'s): used only for a
policy that is one cache rule declaring a decider (``static`` only started with its static set
resident), alone or in a composition that adds no hook
(:mod:`moesim.sim.fast.kernel_choice`), on runs that the fast path accepts and that do not check
the VRAM invariant.
``tests/test_fastpath.py`` checks it against the event loop.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.parts.deciders.base import NO_MISS, Decider, PoolStart
from moesim.sim.engine.plans import access_order
from moesim.sim.engine.records import STEP_CHUNK
from moesim.sim.engine.step import Stepper
from moesim.sim.fast.kernel_choice import sole_rule
from moesim.sim.fast.loads import compute_while_loading, one_lane_loads

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers
    from moesim.sim.engine.workload import Iteration

class _Block:
    """The accesses of a block of iterations, per layer, in access order: ``seqs[l][s]`` the
    experts of layer ``l`` at block iteration ``s``; ``counts[(s, l)]`` their token counts for
    an iteration of several tokens; ``sizes`` the experts of each step (``s * L + l``) when not
    every step runs ``top_k`` of them."""

    def __init__(self, experts: np.ndarray, block: list[Iteration], L: int, K: int, clean: bool) -> None:
        self.seqs: list[list[list[int]]] = []
        self.counts: dict[tuple[int, int], list[int]] = {}
        self.sizes: list[int] | None = None
        if clean and all(it.rows0.shape[0] == 1 for it in block):
            rows = np.concatenate([it.rows0 for it in block])
            self.seqs = [experts[rows + layer].tolist() for layer in range(L)]
            return
        self.seqs = [[] for _ in range(L)]
        sizes: list[int] = []
        for s, it in enumerate(block):
            for layer in range(L):
                flat = experts[it.rows0 + layer].reshape(-1)
                if it.rows0.shape[0] == 1:
                    exps = [x for x in flat.tolist() if x >= 0]
                else:
                    exps, counts = access_order(flat[flat >= 0])
                    self.counts[(s, layer)] = counts
                self.seqs[layer].append(exps)
                sizes.append(len(exps))
        if any(n != K for n in sizes):
            self.sizes = sizes


def _blocks(iters: list[Iteration], L: int) -> list[list[Iteration]]:
    per = max(1, STEP_CHUNK // L)
    return [iters[i:i + per] for i in range(0, len(iters), per)]


def _sequences(state: RunState[Transfers], clean: bool) -> list[np.ndarray]:
    """Each layer's whole access sequence (:attr:`PoolStart.sequences`)."""
    L = state.L
    experts = state.trace.experts
    iters = state.workload.iterations
    if clean and all(it.rows0.shape[0] == 1 for it in iters):
        rows = state.workload.token_rows()
        return [experts[rows + layer].reshape(-1).astype(np.int64) for layer in range(L)]
    parts: list[list[int]] = [[] for _ in range(L)]
    for block in _blocks(iters, L):
        b = _Block(experts, block, L, state.K, clean)
        for layer in range(L):
            for exps in b.seqs[layer]:
                parts[layer].extend(exps)
    return [np.array(p, dtype=np.int64) for p in parts]


def _decider(state: RunState[Transfers], clean: bool) -> Decider:
    """The decider of ``state``'s sole cache rule, its pools as the run starts."""
    rule = sole_rule(state.policy)
    assert rule is not None, "the cache kernel replays one cache rule"
    warm: list[list[int]] = [[] for _ in range(state.L)]
    for (layer, e, _p) in state.vram.units:
        warm[layer].append(e)
    start = PoolStart([c // state.expert_bytes for c in state.vram.capacity], warm,
                      state.transfers.last_evict_iter, lambda: _sequences(state, clean))
    decider = rule.new_decider(start)
    assert decider is not None, "the cache kernel replays a rule that declares a decider"
    return decider


def replay_ordered(state: RunState[Transfers], n_lanes: int) -> None:
    """Replay ``state``'s workload with its cache rule's decider (see the module docstring)."""
    cost = state.cost
    L, K = state.L, state.K
    st = state.stats
    steps = state.steps if state.record_steps else None
    iters = state.workload.iterations
    n_iters = len(iters)
    experts = state.trace.experts
    progress = state.progress
    eb = state.expert_bytes
    clean = not bool((experts < 0).any())
    decider = _decider(state, clean)
    evict_s = cost.hardware.evict_us * 1e-6
    step = Stepper(state)   # the iterations' start, non-MoE and tail costs, as every replay has them
    d = cost.transfer_s(eb)
    e1 = cost.expert_s(1)
    # sums[c]: c one-token experts, summed as the event loop sums a batch of ready experts
    width = max(K, max(slots_ for slots_ in (c // eb for c in state.vram.capacity))) + 1
    sums: list[Any] = [sum([e1] * c) for c in range(width)]
    delays = list(accumulate([evict_s] * width, initial=0.0))   # delays[n]: n evictions' cost, added one at a time
    one_lane = n_lanes == 1
    exp_cost: dict[int, float] = {}
    now = 0.0
    gpu = st.gpu_busy_s
    ovh = st.overhead_s
    stall_sum = st.stall_s
    loads = 0              # demand loads (their copy time is added at the end)
    refetch = 0
    for block in _blocks(iters, L):
        b = _Block(experts, block, L, K, clean)
        idxs = [it.index for it in block]
        n = len(block) * L
        misses: list[Any] = [NO_MISS] * n
        evictions = [0] * n
        refetch += decider.plan(b.seqs, idxs, misses, evictions)
        loads0 = loads
        sizes = [K] * n if b.sizes is None else b.sizes
        starts: list[float] = []     # each iteration's start (a step starts when the one before ends)
        step_of: list[float] = []    # each iteration's non-MoE step (routing is known after it)
        t_end: list[float] = []
        stalls: list[float] = []
        a_end, a_stall = t_end.append, stalls.append
        k = 0
        for s, it in enumerate(block):
            now = step.begin_iteration(it, now)
            starts.append(now)
            layer_s, over_s = step.non_moe_s(it)
            step_s = layer_s + over_s
            step_of.append(step_s)
            head, over = step.tail_s(it)
            single = it.n_tokens == 1
            for layer in range(L):
                miss = misses[k]
                now = now + step_s
                gpu += layer_s
                ovh += over_s
                if not single:   # each expert's cost by its tokens, access order, hits apart
                    missing = set(miss)
                    hit_c: list[float] = []
                    miss_c: list[float] = []
                    for e, c in zip(b.seqs[layer][s], b.counts[(s, layer)], strict=True):
                        t_exp = exp_cost.get(c)
                        if t_exp is None:
                            t_exp = exp_cost[c] = cost.expert_s(c)
                        (miss_c if e in missing else hit_c).append(t_exp)
                if miss:
                    m = len(miss)
                    stall = delays[evictions[k]]
                    if stall > 0:
                        now = now + stall
                    h = sizes[k] - m
                    if not single:
                        now, stall, gpu = compute_while_loading(now, stall, gpu, h, m, n_lanes, d, sums,
                                                                sum(hit_c), miss_c)
                    elif m == 1:   # compute_while_loading of one load, inline (the common case)
                        landed = now + d
                        if h:
                            dt = sums[h]
                            now = now + dt
                            gpu += dt
                        if landed > now:
                            stall += landed - now
                            now = landed
                        gpu += e1
                        now = now + e1
                    elif one_lane:
                        now, stall, gpu = one_lane_loads(now, stall, gpu, h, m, d, sums)
                    else:
                        now, stall, gpu = compute_while_loading(now, stall, gpu, h, m, n_lanes, d, sums)
                    loads += m
                    stall_sum += stall
                    a_stall(stall)
                else:
                    dt = sums[sizes[k]] if single else sum(hit_c)
                    now = now + dt
                    gpu += dt
                    a_stall(0.0)
                a_end(now)
                k += 1
            if head + over > 0:
                now = now + (head + over)
                gpu += head
                ovh += over
            step.end_iteration(it, now)
            if progress is not None:
                progress(it.index + 1, n_iters)
        # the block's counters and step records
        m_total = loads - loads0   # every missed expert is loaded
        n_total = sum(sizes)
        st.hits += n_total - m_total
        st.misses += m_total
        st.fetch_needed += m_total
        st.demand_bytes += m_total * eb
        st.evictions += sum(evictions)
        if steps is not None:
            mm = np.array([len(x) for x in misses], dtype=np.int64)
            steps.extend_layers(idxs, L, starts, step_of, t_end, np.array(sizes, dtype=np.int64) - mm, 0, mm,
                                stalls, eb, evictions=evictions)
    st.gpu_busy_s, st.overhead_s, st.stall_s = gpu, ovh, stall_sum
    st.refetch_bytes += refetch * eb
    if loads:   # every landing adds the same copy time, one after another
        st.pcie_busy_s = float(np.add.accumulate(np.concatenate(([st.pcie_busy_s], np.full(loads, d))))[-1])
    decider.finish(state.transfers.last_evict_iter)
    state.vram.peak = max(state.vram.peak, decider.resident() * eb)
    state.cur_iter = state.prev_iter = iters[-1]
    state.cur_layer = L
    state.fast_now = now
