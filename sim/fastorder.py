"""Cache kernels of the fast path: LRU and FIFO replayed with one ordered dict per pool, LFU with
a heap per pool, without policy objects, EvictionRequests or candidate lists.

LRU's victim is the candidate (resident, unpinned unit of the pool) of oldest last access, FIFO's
the one inserted longest ago (:class:`~moesim.policies.parts.caches.RecencyCache` keeps those
times on a logical clock). Kept as an ordered dict of each pool's resident experts, oldest
first, the victim is the first entry that is not pinned: the layer's own hits are the only
pinned residents, so the search skips at most ``top_k x tokens`` entries, O(1) in the cache
size. Accesses are applied after the layer's demand loads were given room, in access order, as
``on_access`` applies them: LRU moves every accessed expert to the end, FIFO appends the new
ones only. Time advances exactly as in :mod:`moesim.sim.fastpath`, whose layer timing this module
reuses; ``tests/test_fastpath.py`` checks both against the event loop.

Random draws from the rule's own random stream among the unpinned residents listed in the order
they came in (the engine's candidate order): O(C) per eviction, like the rule.

LFU keeps each resident's in-cache count and last access time (a clock shared by all pools, as
the rule's) and a lazily pruned heap: O(log C) per eviction.

Used only for the registered ``lru``, ``fifo``, ``lfu`` and ``random`` policies as shipped (the exact classes, no
hook overridden) on runs that the fast path accepts and that do not check the VRAM invariant
(this kernel keeps its own books, not :class:`~moesim.sim.vram.Vram`'s).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from moesim.policies.base import INFLIGHT, QUEUED, RESIDENT
from moesim.policies.compose import Composed
from moesim.policies.parts.caches import FIFOCache, LFUCache, LRUCache, RandomCache
from moesim.sim.plans import access_order
from moesim.sim.vram import Unit

if TYPE_CHECKING:
    from moesim.sim.engine import Engine



def finish_iteration(st: Any, cost: Any, it: Any, n_tok: int, now: float) -> float:
    """After an iteration's last layer: charge the LM head and the per-iteration overhead, and
    record when the iteration and its requests' tokens end (both fast replays; the same float
    operations as the event loop). Returns the new time."""
    head = cost.head_s(n_tok)
    over = cost.overhead_iteration_s(n_tok)
    if head + over > 0:
        now = now + (head + over)
        st.gpu_busy_s += head
        st.overhead_s += over
    st.end_iteration(it, now)
    return now

def ordered_kind(engine: Engine) -> str | None:
    """``"lru"``, ``"fifo"``, ``"lfu"`` or ``"random"`` when ``engine``'s policy is exactly that shipped cache (alone or
    in a composition of nothing else that overrides no hook), else None."""
    policy = engine.policy
    rule: Any = policy
    if isinstance(policy, Composed):
        if not policy.demand_only():
            return None
        rule = policy.cache
    if type(rule) is LRUCache:
        return "lru"
    if type(rule) is FIFOCache:
        return "fifo"
    if type(rule) is LFUCache:
        return "lfu"
    if type(rule) is RandomCache:
        return "random"
    return None


class _Clock:
    """The logical clock of :class:`~moesim.policies.parts.caches.RecencyCache`: one tick per
    access, shared by every pool."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0


class _LfuPool:
    """One pool of LFU: each resident expert's in-cache access count and last access time, and
    a heap of ``(count, last, expert)`` whose stale entries are skipped (lazy deletion). The
    victim is the unpinned resident of least ``(count, last)``, as ``LFUCache.victim`` picks it:
    O(log C) per eviction, amortised."""

    __slots__ = ("clock", "count", "last", "heap")

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.count: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.heap: list[tuple[int, int, int]] = []

    def __contains__(self, e: int) -> bool:
        return e in self.count

    def __len__(self) -> int:
        return len(self.count)

    def __delitem__(self, e: int) -> None:
        del self.count[e]
        del self.last[e]

    def access(self, exps: list[int]) -> None:
        """Accesses in order: a new expert starts at count 1, a resident one counts one more."""
        clock, count, last, heap = self.clock, self.count, self.last, self.heap
        for e in exps:
            clock.t += 1
            c = count.get(e, 0) + 1
            count[e] = c
            last[e] = clock.t
            heapq.heappush(heap, (c, clock.t, e))
        if len(heap) > 4 * len(count) + 64:   # drop the stale entries
            self.heap = [(count[e], last[e], e) for e in count]
            heapq.heapify(self.heap)

    def victim(self, pinned: Any) -> int:
        """The unpinned resident of least (count, last); pinned entries go back on the heap."""
        heap, count, last = self.heap, self.count, self.last
        held = []
        while True:
            c, t, e = heapq.heappop(heap)
            if count.get(e) != c or last.get(e) != t:
                continue   # stale
            if e in pinned:
                held.append((c, t, e))
                continue
            for x in held:
                heapq.heappush(heap, x)
            return e   # the caller deletes it


class _Resident:
    """A stand-in for a resident unit in the layer timing (only its state is read)."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = RESIDENT


def replay_ordered(eng: Engine, kind: str, n_lanes: int) -> None:
    """Replay ``eng``'s workload with the ``kind`` ("lru", "fifo", "lfu" or "random") kernel."""
    from moesim.sim.fastpath import compute_with_loads

    cost = eng.cost
    L = eng.L
    st = eng.stats
    tx = eng.transfers
    vram = eng.vram
    steps = eng.steps if eng.record_steps else None
    iters = eng.workload.iterations
    n_iters = len(iters)
    trace_experts = eng.trace.experts
    progress = eng.progress
    lru = kind == "lru"
    lfu = kind == "lfu"
    rule: Any = eng.policy.cache if isinstance(eng.policy, Composed) else eng.policy
    rng = rule._rng if kind == "random" else None   # the rule's own stream (the run's policy seed)
    eb = eng.expert_bytes
    slots = [c // eb for c in vram.capacity]
    evict_s = cost.hardware.evict_us * 1e-6
    demand_s = cost.demand_load_s()
    overhead_layer = cost.overhead_layer_s()
    transfer_s = cost.transfer_s
    last_evict: dict[tuple[int, int, int], int] = tx.last_evict_iter
    # each pool's resident experts, oldest first: the warm start in the order it was placed
    clock = _Clock()
    res: list[Any] = [_LfuPool(clock) if lfu else OrderedDict() for _ in range(L)]
    for (layer, e, _p) in vram.units:
        if lfu:
            res[layer].access([e])
        else:
            res[layer][e] = None
    total = sum(len(r) for r in res)
    peak = vram.peak
    resident = _Resident()
    batch_start: dict[int, float] = {}
    exp_cost: dict[int, float] = {}
    dur_of: dict[int, float] = {}
    now = 0.0
    for it in iters:
        eng.cur_iter = it
        idx = it.index
        st.start_iteration(it, now, batch_start)
        n_tok = it.n_tokens
        layer_s = cost.layer_s(n_tok)
        step_s = layer_s + overhead_layer
        single = n_tok == 1
        row0 = int(it.rows0[0]) if single else 0
        for layer in range(L):
            t0 = now
            now = now + step_s
            st.gpu_busy_s += layer_s
            st.overhead_s += overhead_layer
            if single:
                exps = [x for x in trace_experts[row0 + layer].tolist() if x >= 0]
                counts = [1] * len(exps)
            else:
                flat = trace_experts[it.rows0 + layer].reshape(-1)
                exps, counts = access_order(flat[flat >= 0])
            pool = res[layer]
            cap = slots[layer]
            need: list[tuple[float, Any]] = []
            misses: list[Any] = []
            miss_e: list[int] = []
            hits = 0
            for i, e in enumerate(exps):
                c = counts[i]
                t_exp = exp_cost.get(c)
                if t_exp is None:
                    t_exp = exp_cost[c] = cost.expert_s(c)
                if e in pool:
                    hits += 1
                    need.append((t_exp, resident))
                else:
                    u = Unit((layer, e, 0), eb, layer, True)
                    misses.append(u)
                    miss_e.append(e)
                    need.append((t_exp, u))
            n_miss = len(misses)
            st.hits += hits
            st.misses += n_miss
            st.fetch_needed += n_miss
            stall = 0.0
            evictions = 0
            if misses:
                delay = 0.0
                held = len(pool)
                pinned = set(exps) if len(exps) > 8 else exps   # the layer's experts: never victims
                for _ in misses:
                    n = 0
                    while held + 1 > cap:
                        if lfu:
                            victim = pool.victim(pinned)
                        elif rng is not None:
                            cands = [k for k in pool if k not in pinned]
                            victim = cands[int(rng.integers(len(cands)))]
                        else:
                            for victim in pool:
                                if victim not in pinned:
                                    break
                        del pool[victim]
                        last_evict[(layer, victim, 0)] = idx
                        held -= 1
                        n += 1
                    held += 1
                    delay += n * evict_s
                    if demand_s:
                        delay += demand_s
                    evictions += n
                total += n_miss - evictions
                if total * eb > peak:
                    peak = total * eb
                if delay > 0:
                    now = now + delay
                stall += delay
                for j, u in enumerate(misses):
                    key = u.key
                    was = last_evict.get(key)
                    if was is not None and idx - was <= 1:
                        st.refetch_bytes += eb
                    st.demand_bytes += eb
                    u.state = INFLIGHT if j < n_lanes else QUEUED
                st.evictions += evictions
            # the layer's accesses, in access order (on_access)
            if lru:
                for e in exps:
                    if e in pool:
                        pool.move_to_end(e)
                    else:
                        pool[e] = None
            elif lfu:
                pool.access(exps)
            else:
                for e in miss_e:
                    pool[e] = None
            if not misses:
                dt = sum([x[0] for x in need])
                now = now + dt
                st.gpu_busy_s += dt
            else:
                now, stall = compute_with_loads(st, need, misses, n_lanes, now, stall, transfer_s, dur_of)
            st.stall_s += stall
            if steps is not None:
                steps.append((idx, layer, t0, t0 + step_s, now, len(exps), hits, 0, 0, n_miss, 0,
                              stall, n_miss * eb, 0, evictions))
        now = finish_iteration(st, cost, it, n_tok, now)
        eng.prev_iter = it
        if progress is not None:
            progress(idx + 1, n_iters)
    vram.peak = peak
    eng.cur_layer = L
    eng.fast_now = now
