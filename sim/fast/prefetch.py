"""The next-layer prefetch kernel of the fast path (mixtral-offloading, oracle-prefetch): LRU
caches per layer and one copy lane, replayed without SimPy or policy objects, with the event
loop's exact metrics and step records.

State is kept flat: per layer the units present (:class:`_U`), least recently used first (in
the order of the rule's ``last_uses`` clocks, a unit moved to the end when used); the lane's
transfer in flight with its landing (time, creation order) and its queue
``(class, -priority, order, unit)`` (demand loads first, a prefetch's priority its score; under
``pcie.order: fifo`` issue order, nothing withdrawn). Each landing SimPy would process before
the GPU resumes (by time, then creation order) is processed first, with the GPU's state of that
moment (iteration for refetches, layer for the step's prefetch bytes); a GPU waiting for one
landing resumes right after it, for several (a condition event) or for room as
:mod:`moesim.sim.engine.gpu` does. The rules of :mod:`moesim.sim.engine.transfers` follow: hits, late (queued
or in flight) and misses; demand loads get room in access order from LRU victims among resident,
unpinned units, withdrawing queued prefetches of the pool, else wait (computing then in
:func:`~moesim.sim.engine.plans.next_in_fixed_order`), delayed by ``evict_us`` and ``demand_load_us``;
the guess (:mod:`moesim.policies.parts.guesses`) is refreshed where present, else prefetched,
never evicting a member of the set nor into a pool where a demand load waits.

Which runs it takes: :mod:`moesim.sim.fast.kernel_choice`; ``tests/test_fastprefetch.py``
compares the kernel with the event loop on random traces.
"""

from __future__ import annotations

import heapq
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import INFLIGHT, QUEUED, RESIDENT, WAITING
from moesim.policies.parts.guesses import GuessMaker
from moesim.sim.engine.part_order import early_parts, ready_parts
from moesim.sim.engine.plans import access_order
from moesim.sim.engine.records import STEP_CHUNK
from moesim.sim.engine.step import Stepper
from moesim.sim.fast.kernel_choice import next_layer_parts, predictor_source

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


_NEVER = -(1 << 62)   # the iteration of the last eviction of a unit never evicted
_IDLE = float("inf")   # the landing time of an idle lane


class _U:
    """A unit of a layer's pool: its expert, state, whether it was loaded on demand, whether it
    was used since it came, and the iteration of its last eviction."""

    __slots__ = ("layer", "e", "state", "demand", "used", "out")

    def __init__(self, layer: int, e: int) -> None:
        self.layer = layer
        self.e = e
        self.state = 0
        self.demand = self.used = False
        self.out = _NEVER


def replay_prefetch(state: RunState[Transfers]) -> None:
    """Replay ``state``'s workload with the kernel (see the module docstring), the prefetcher
    guessing from its predictor's source (:class:`~moesim.policies.parts.guesses.GuessMaker`);
    leaves the counters, step records and clock as the event loop would."""
    cost, st, tx, vram = state.cost, state.stats, state.transfers, state.vram
    L, E = state.L, state.E
    parts = next_layer_parts(state.policy)
    assert parts is not None, "not a policy of the prefetch kernel (sim/fast/kernel_choice.py)"
    cache, pf = parts
    source = predictor_source(pf)
    assert source is not None, "a predictor the kernel does not reproduce"
    eb = state.expert_bytes
    steps = state.steps if state.record_steps else None
    iters, progress = state.workload.iterations, state.progress
    n_iters = len(iters)
    experts = state.trace.experts
    clean = not bool((experts < 0).any())   # no dropped routing slots (-1)
    kp = pf.experts_per_token
    # the layer whose guess each layer's after_layer prefetches (-1: none; after the last layer,
    # the next token's first where guesses cross tokens)
    targets = [*range(1, L), 0 if pf.cross_token else -1] if kp else [-1] * L
    guess = GuessMaker(source, state.trace, [it.rows0 for it in iters], L, E, kp)
    evict_s = cost.hardware.evict_us * 1e-6
    demand_s = cost.demand_load_s()
    step = Stepper(state)   # the iterations' start, non-MoE and tail costs, as every replay has them
    d = cost.transfer_s(eb)
    e1 = cost.expert_s(1)
    sums = [sum([e1] * c) for c in range(E + 1)]   # c one-token experts, summed as the event loop sums them
    exp_cost: dict[int, float] = {}

    free = [(c - u) // eb for c, u in zip(vram.capacity, vram.used, strict=True)]   # room, in units
    total, peak = vram.total, vram.peak
    # one unit object per (layer, expert), reused when it comes back (one that left is referenced nowhere)
    objs = [[_U(layer, e) for e in range(E)] for layer in range(L)]
    for (layer, e, _p), r in tx.last_evict_iter.items():
        objs[layer][e].out = r
    # the pools, least recently used first (the units placed at the start in the order of their clocks)
    clocks = cache.last_uses()
    pools: list[dict[int, _U]] = [{} for _ in range(L)]
    for key, u0 in sorted(vram.units.items(), key=lambda kv: clocks.get(kv[0], 0)):
        w0 = pools[key[0]][key[1]] = objs[key[0]][key[1]]
        w0.state, w0.demand, w0.used = RESIDENT, u0.demand, u0.used

    # the copy lane: the transfer in flight (None: idle, landing at _IDLE), its landing (time, creation order)
    cur: _U | None = None
    t_land, q_land = _IDLE, 0
    lq: list[tuple[int, float, int, _U]] = []   # queued: (class, -priority, order, unit)
    fifo = not tx.lanes.can_withdraw   # pcie.order fifo: (0, 0.0, order, unit), issue order
    lseq, q = 0, 1   # queue order; creation order of the next event (SimPy's event ids, relative)
    space = bool(tx.space_event.triggered)   # room freed since the GPU last looked
    waiting: list[_U] = []
    it_index = 0   # the GPU's iteration
    # the step records of a block of iterations, handed over as columns (StepRecords.extend_layers);
    # prefetch bytes and evictions by step (k: the GPU's step in the block, -1 between layers)
    per = max(1, STEP_CHUNK // L)
    idxs: list[int] = []
    starts: list[float] = []
    step_of: list[float] = []
    ends: list[float] = []
    hit_c: list[int] = []
    late_c: list[int] = []
    miss_c: list[int] = []
    stalls: list[float] = []
    pf_b = [0] * (per * L + 1)
    ev_n = [0] * (per * L + 1)
    k = -1
    cur_layer = -1
    no_pins: set[int] = set()   # never filled
    pinned = no_pins   # experts of the current layer not yet computed
    gpu, ovh, stall_sum = st.gpu_busy_s, st.overhead_s, st.stall_s
    n_refetch = n_demand = n_pf = n_ev = n_waste = 0   # bytes and units of the run (n_pf, n_ev: of past blocks)
    n_hits = n_late = n_miss = n_needed = n_covered = 0
    now = 0.0

    def start(u: _U, t: float) -> None:
        """The lane starts ``u`` at ``t`` (Transfers.count_start's books)."""
        nonlocal cur, t_land, q_land, q, n_refetch, n_demand
        u.state = INFLIGHT
        if it_index - u.out <= 1:
            n_refetch += eb
        if u.demand:
            n_demand += 1
        else:
            pf_b[k] += eb
        cur = u
        t_land = t + d
        q_land = q
        q += 1

    def land() -> float:
        """The transfer in flight lands; the lane starts the next. Returns the landing time."""
        nonlocal cur, space, t_land
        t = t_land
        cur.state = RESIDENT   # type: ignore[union-attr]
        if waiting:
            space = True
        if lq:
            start(heappop(lq)[3], t)
        else:
            cur = None
            t_land = _IDLE
        return t

    def advance(T: float) -> None:
        """A GPU timeout to ``T``: every landing SimPy processes before it, in order."""
        nonlocal q
        g = q
        q += 1
        while t_land < T or (t_land == T and q_land < g):
            land()

    def wait_for(units: list[_U]) -> float:
        """The GPU waits for the first landing among ``units`` (queued or in flight): with one,
        it resumes right after it; with several, through a condition event scheduled after
        that landing (landings due before it come first). Returns when it resumes."""
        if len(units) == 1:
            w = units[0]
            while True:
                t = land()
                if w.state == RESIDENT:
                    return t
        while True:
            u = cur
            t = land()
            if u in units:
                break
        advance(t)
        return t

    def evict_lru(p: int, protected: Any) -> bool:
        """Evict the LRU resident, unpinned (and unprotected) unit of pool ``p``; False if none."""
        nonlocal total, space, n_waste
        pool = pools[p]
        pin = pinned if p == cur_layer else ()
        for e, u in pool.items():   # least recently used first
            if u.state == RESIDENT and e not in pin and e not in protected:
                break
        else:
            return False
        del pool[e]
        ev_n[k] += 1
        free[p] += 1
        total -= eb
        space = True
        if not u.used and not u.demand:
            n_waste += eb
        u.out = it_index
        return True

    def cancel_pool(p: int) -> int:
        """Withdraw the queued prefetches of pool ``p`` (not pinned ones)."""
        nonlocal lq, total, space
        if fifo:   # an issued copy cannot be withdrawn
            return 0
        pin = pinned if p == cur_layer else ()
        kept = []
        n = 0
        for entry in lq:
            u = entry[3]
            if entry[0] == 1 and u.layer == p and u.e not in pin:
                u.state = 0
                del pools[p][u.e]
                free[p] += 1
                total -= eb
                n += 1
            else:
                kept.append(entry)
        if n:
            heapq.heapify(kept)
            lq = kept
            space = True
        return n

    def grant() -> float:
        """Room for waiting demand loads, in order (Transfers.grant_waiting: an eviction, else
        the pool's queued prefetches withdrawn), then the wait for their delay and their
        queueing; returns the delay."""
        nonlocal now, total, peak, lseq
        delay = 0.0
        granted = []
        while waiting:
            u = waiting[0]
            p = u.layer
            if not free[p]:   # one eviction, or one withdrawn prefetch, makes room
                if evict_lru(p, ()):
                    delay += evict_s
                elif not cancel_pool(p):
                    break
            free[p] -= 1   # take its room (Vram.take_room)
            total += eb
            if total > peak:
                peak = total
            waiting.pop(0)
            u.state = QUEUED
            granted.append(u)
            if demand_s:
                delay += demand_s
        if delay > 0:
            T = now + delay
            advance(T)
            now = T
        for u in granted:   # queued as demand loads
            lseq += 1
            heappush(lq, (0, 0.0, lseq, u))
            if cur is None:
                start(heappop(lq)[3], now)
        return delay

    for pos, it in enumerate(iters):
        it_index = it.index
        cur_layer = -1
        now = step.begin_iteration(it, now)
        layer_s, over_s = step.non_moe_s(it)
        step_s = layer_s + over_s
        k0 = len(ends)
        idxs.append(it_index)
        starts.append(now)
        step_of.append(step_s)
        single = it.n_tokens == 1
        if single:
            row0 = int(it.rows0[0])
            ex_rows = experts[row0:row0 + L].tolist()
        if kp:
            ti, tv = guess.guesses(pos)
        for layer in range(L):
            cur_layer = layer
            k = k0 + layer
            T = now + step_s
            if t_land <= T:   # else nothing is due first: no event needed
                advance(T)
            now = T
            gpu += layer_s
            ovh += over_s
            if single:
                exps = ex_rows[layer]
                if not clean and -1 in exps:
                    exps = [x for x in exps if x >= 0]
            else:
                flat = experts[it.rows0 + layer].reshape(-1)
                exps, counts = access_order(flat[flat >= 0])
            pool = pools[layer]
            us: list[_U] = []
            miss_units: list[_U] = []
            hits = late = miss = 0
            for e in exps:
                # on_access's LRU refresh (to the end), here: demand loads evict unpinned units only, not these
                u = pool.pop(e, None)
                if u is None:
                    u = objs[layer][e]
                    u.state, u.demand, u.used = WAITING, True, False
                    miss_units.append(u)
                    miss += 1
                elif u.state == RESIDENT:
                    hits += 1
                else:
                    late += 1
                pool[e] = u
                if not u.used:
                    n_needed += 1
                    if not u.demand:
                        n_covered += 1
                    u.used = True
                us.append(u)
            stall = 0.0
            # pins matter where this layer's pool may lose units (demand loads, a one-layer prefetch)
            pinned = set(exps) if miss_units or L == 1 or not single else no_pins
            if miss_units:
                waiting.extend(miss_units)
                stall += grant()
            # after_layer: prefetch the lookahead's guess for the next layer
            tgt = targets[layer]
            if tgt >= 0:
                tix = ti[layer]
                tvx = tv[layer]
                tpool = pools[tgt]
                absent = []   # issuing never evicts a member of the set: absent ones stay absent
                for j, e in enumerate(tix):
                    if e in tpool:
                        tpool[e] = tpool.pop(e)   # refreshed
                    else:
                        absent.append(j)
                if absent and (not waiting or not any(w.layer == tgt for w in waiting)):
                    for j in absent:
                        if not free[tgt] and not evict_lru(tgt, tix):   # one eviction makes room
                            continue
                        free[tgt] -= 1   # take its room (Vram.take_room)
                        total += eb
                        if total > peak:
                            peak = total
                        e = tix[j]
                        u = tpool[e] = objs[tgt][e]
                        u.state, u.demand, u.used = QUEUED, False, False
                        lseq += 1
                        if cur is None:   # the lane is idle, its queue empty: it starts at once
                            start(u, now)
                        else:
                            heappush(lq, (0, 0.0, lseq, u) if fifo else (1, -tvx[j], lseq, u))
            # the experts compute as they become resident, ready ones first
            if single and not waiting:
                rem = us
                while rem:
                    ready = 0
                    rest = []
                    for u in rem:
                        if u.state == RESIDENT:
                            ready += 1
                        else:
                            rest.append(u)
                    if ready:
                        dt = sums[ready]
                        T = now + dt
                        if t_land <= T:
                            advance(T)
                        now = T
                        gpu += dt
                        rem = rest
                        continue
                    ts = now
                    if len(rem) == 1:   # wait_for's first case, inline: resume right after its landing
                        w = rem[0]
                        now = land()
                        while w.state != RESIDENT:
                            now = land()
                    else:
                        now = wait_for(rem)
                    stall += now - ts
            else:
                need: list[tuple[int, float, _U]] = []
                for i, u in enumerate(us):
                    c = 1 if single else counts[i]
                    t_exp = exp_cost.get(c)
                    if t_exp is None:
                        t_exp = exp_cost[c] = cost.expert_s(c)
                    need.append((i, t_exp, u))
                remaining = need
                early: set[int] | None = None
                while remaining:
                    if waiting and early is None:   # room is short: the fixed order (sim/engine/step.py)
                        early = early_parts(need, miss_units)
                    ready_x, rest_x, watch = ready_parts(remaining, early if waiting else None)
                    if ready_x:
                        dt = ready_x[0][1] if len(ready_x) == 1 else sum([x[1] for x in ready_x])
                        T = now + dt
                        advance(T)
                        now = T
                        gpu += dt
                        remaining = rest_x
                        for x in ready_x:
                            pinned.discard(x[2].e)
                        if waiting:
                            stall += grant()
                        continue
                    ts = now
                    evs = [x[2] for x in watch if x[2].state in (QUEUED, INFLIGHT)]
                    if evs:
                        now = wait_for(evs)
                    elif waiting:
                        if space:
                            space = False
                            grant()
                        else:
                            if cur is None:   # pragma: no cover - the event loop raises BudgetError
                                raise AssertionError("demand loads wait for room that nothing will free")
                            now = land()
                    else:  # pragma: no cover - every remaining unit is resident, queued, in flight or waiting
                        raise AssertionError("expert neither present nor waiting")
                    stall += now - ts
            pinned = no_pins
            stall_sum += stall
            ends.append(now)
            hit_c.append(hits)
            late_c.append(late)
            miss_c.append(miss)
            stalls.append(stall)
        k = -1
        head, over = step.tail_s(it)
        if head + over > 0:
            T = now + (head + over)
            advance(T)
            now = T
            gpu += head
            ovh += over
        step.end_iteration(it, now)
        cur_layer = L
        if len(idxs) == per or pos + 1 == n_iters:
            n = len(ends)
            if steps is not None:
                steps.extend_layers(idxs, L, starts, step_of, ends, hit_c, late_c, miss_c, stalls, eb,
                                    pf_b[:n], ev_n[:n])
            n_hits += sum(hit_c)
            n_late += sum(late_c)
            n_miss += sum(miss_c)
            n_pf += sum(pf_b)
            n_ev += sum(ev_n)
            pf_b = [0] * (per * L + 1)
            ev_n = [0] * (per * L + 1)
            for col in (idxs, starts, step_of, ends, hit_c, late_c, miss_c, stalls):
                col.clear()
        state.prev_iter = it
        if progress is not None:
            progress(it.index + 1, n_iters)
    # the GPU process ends at ``now``: SimPy processes every landing due by then first
    while t_land <= now:
        land()
    st.gpu_busy_s, st.overhead_s, st.stall_s = gpu, ovh, stall_sum
    n_pf += sum(pf_b)
    n_ev += sum(ev_n)
    landed = n_demand + n_pf // eb - (cur is not None)   # every copy started has landed but the one in flight
    if landed:   # each landing adds the same copy time, one after another
        st.pcie_busy_s = float(np.add.accumulate(np.concatenate(([st.pcie_busy_s], np.full(landed, d))))[-1])
    # prefetch_used: units first used since a prefetch brought them, as fetch_covered
    for name, n in (("hits", n_hits), ("late", n_late), ("misses", n_miss), ("fetch_needed", n_needed),
                    ("fetch_covered", n_covered), ("prefetch_used", n_covered), ("refetch_bytes", n_refetch),
                    ("demand_bytes", n_demand * eb), ("prefetch_bytes", n_pf), ("prefetch_units", n_pf // eb),
                    ("evictions", n_ev), ("wasted_prefetch_bytes", n_waste)):
        setattr(st, name, getattr(st, name) + n)
    tx.last_evict_iter.update({(u.layer, u.e, 0): u.out for row in objs for u in row if u.out != _NEVER})
    vram.peak = max(vram.peak, peak)
    state.cur_layer = L
    state.fast_now = now
