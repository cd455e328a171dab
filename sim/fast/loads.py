"""A layer's experts computing while its demand loads land, as the event loop orders it: the
layer timing shared by the fast replays (:mod:`moesim.sim.fast.path`, :mod:`moesim.sim.fast.order`).

:func:`compute_with_loads` takes any layer (experts of different token counts, loads of any
size); :func:`uniform_loads` is the same computation for a layer whose experts all cost the same
and whose loads all take the same time (one token per iteration, whole experts): no heap, no
unit objects, the same floating-point operations in the same order.
"""

from __future__ import annotations

import heapq
from typing import Any

from moesim.policies.contract.base import INFLIGHT, RESIDENT


def compute_with_loads(st: Any, need: list[tuple[int, float, Any]], loads: list[Any], n_lanes: int,
                        now: float, stall: float, transfer_s: Any, dur_of: dict[int, float]
                        ) -> tuple[float, float]:
    """One layer's experts computing while its demand loads land, as the event loop orders it.

    Events are ``(time, creation order, kind, index)``: a landing (kind 0) or the GPU's compute
    step ending (kind 1), processed in SimPy's order. ``loads`` were issued at ``now`` in order;
    load ``j`` takes lane ``j % n_lanes`` (the lanes hand out their lowest free id) or waits for
    the load ``n_lanes`` ahead of it to land. Returns the new time and the layer's stall."""
    if len(loads) == 1:
        # one load (the common case): the layer's hits compute in one step while it lands; it
        # is resident when that step ends if it landed by then (it was issued before the step)
        u = loads[0]
        d = dur_of.get(u.nbytes)
        if d is None:
            d = dur_of[u.nbytes] = transfer_s(u.nbytes)
        landed = now + d
        st.pcie_busy_s += d
        u.state = RESIDENT
        first = [x[1] for x in need if x[2] is not u]
        if first:
            dt = sum(first)
            now = now + dt
            st.gpu_busy_s += dt
        if landed > now:
            stall += landed - now
            now = landed
        dt = sum([x[1] for x in need if x[2] is u])
        st.gpu_busy_s += dt
        return now + dt, stall
    seq = 0
    heap: list[tuple[float, int, int, int]] = []
    durs = []
    for u in loads:
        d = dur_of.get(u.nbytes)
        if d is None:
            d = dur_of[u.nbytes] = transfer_s(u.nbytes)
        durs.append(d)
    m = len(loads)
    for j in range(min(n_lanes, m)):
        heapq.heappush(heap, (now + durs[j], seq, 0, j))
        seq += 1
    next_load = min(n_lanes, m)

    def land(t: float, j: int) -> None:
        nonlocal seq, next_load
        u = loads[j]
        u.state = RESIDENT
        st.pcie_busy_s += durs[j]
        if next_load < m:   # the lane starts the next queued load
            k = next_load
            next_load += 1
            loads[k].state = INFLIGHT
            heapq.heappush(heap, (t + durs[k], seq, 0, k))
            seq += 1

    remaining = need
    while remaining:
        ready = [x for x in remaining if x[2].state == RESIDENT]
        if ready:
            dt = sum([x[1] for x in ready])
            t_end = now + dt
            g = seq   # the GPU's timeout, created now
            seq += 1
            while heap and (heap[0][0], heap[0][1]) < (t_end, g):
                t, _, _, j = heapq.heappop(heap)
                land(t, j)
            now = t_end
            st.gpu_busy_s += dt
            if len(ready) == len(remaining):
                remaining = []
            else:
                done = set(id(x) for x in ready)
                remaining = [x for x in remaining if id(x) not in done]
            continue
        # nothing ready: the GPU waits for the first landing of its remaining units; with
        # several it resumes through a condition event scheduled after every landing of that
        # instant, with one right after that landing
        ts = now
        several = len(remaining) > 1   # none is resident: each one's load is still to land
        t, _, _, j = heapq.heappop(heap)
        land(t, j)
        if several:
            cond = seq
            seq += 1
            while heap and (heap[0][0], heap[0][1]) < (t, cond):
                t2, _, _, j2 = heapq.heappop(heap)
                land(t2, j2)
        now = t
        stall += now - ts
    return now, stall




def uniform_loads(now: float, stall: float, gpu: float, h: int, m: int, n_lanes: int, d: float,
                  sums: list[float]) -> tuple[float, float, float]:
    """:func:`compute_with_loads` for ``h`` resident experts and ``m >= 1`` demand loads when
    every expert costs the same and every load takes ``d`` seconds (``sums[c]`` is the cost of
    ``c`` experts, summed as the event loop sums them). Returns the new time, stall and GPU busy
    time (``gpu`` plus this layer's compute, added batch by batch in the same order).

    Load ``j`` starts at once on a free lane or when load ``j - n_lanes`` lands, so loads land
    in index order; ``T[j]`` and ``Q[j]`` are its landing time and creation order (the heap key
    of :func:`compute_with_loads`)."""
    started = n_lanes if n_lanes < m else m
    t1 = now + d
    T = [t1] * m
    Q = list(range(m))
    seq = started
    landed = 0      # loads landed: 0..landed-1
    done = 0        # demand-loaded experts computed
    left = h        # resident experts not computed yet (all compute in the first batch)
    while True:
        ready = landed - done
        c = left + ready
        if c:
            dt = sums[c]
            t_end = now + dt
            g = seq   # the GPU's timeout, created now
            seq += 1
            while landed < started and (T[landed] < t_end or (T[landed] == t_end and Q[landed] < g)):
                if started < m:   # the lane starts the next queued load
                    T[started] = T[landed] + d
                    Q[started] = seq
                    seq += 1
                    started += 1
                landed += 1
            now = t_end
            gpu += dt
            left = 0
            done += ready
            if done == m:
                return now, stall, gpu
            continue
        # nothing ready: wait for the next landing (with several experts left, a condition
        # event scheduled after every landing of that instant)
        ts = now
        t = T[landed]
        if started < m:
            T[started] = t + d
            Q[started] = seq
            seq += 1
            started += 1
        landed += 1
        if m - done > 1:
            cond = seq
            seq += 1
            while landed < started and T[landed] == t and Q[landed] < cond:
                if started < m:
                    T[started] = T[landed] + d
                    Q[started] = seq
                    seq += 1
                    started += 1
                landed += 1
        now = t
        stall += now - ts


def one_lane_loads(now: float, stall: float, gpu: float, h: int, m: int, d: float,
                   sums: list[float]) -> tuple[float, float, float]:
    """:func:`uniform_loads` on one copy lane (the catalog's hardware): the loads land one
    after another, each issued when the one before lands, so only the load in flight matters:
    it lands at ``t_next``; it was issued before the GPU's current timeout unless a landing
    processed after that timeout was created issued it (then only an earlier time comes first)."""
    t_next = now + d
    landed = 0
    done = 0
    if h:   # the resident experts compute while the first loads land
        t_end = now + sums[h]
        if t_next <= t_end:
            landed = 1
            t_next = t_next + d
            while landed < m and t_next < t_end:
                landed += 1
                t_next = t_next + d
        gpu += sums[h]
        now = t_end
    while True:
        if landed == done:
            # nothing ready: wait for the next landing (with several experts left, through a
            # condition event scheduled after it, which a load issued by it at the same
            # instant precedes)
            t = t_next
            landed += 1
            t_next = t + d
            if t_next == t and landed < m and m - done > 1:
                landed += 1
                t_next = t_next + d
            stall += t - now
            now = t
        # compute what has landed while later loads land
        ready = landed - done
        dt = sums[ready]
        t_end = now + dt
        if t_next <= t_end and landed < m:
            landed += 1
            t_next = t_next + d
            while landed < m and t_next < t_end:
                landed += 1
                t_next = t_next + d
        now = t_end
        gpu += dt
        done += ready
        if done == m:
            return now, stall, gpu
