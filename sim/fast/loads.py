"""A layer's experts computing while its demand loads land, as the event loop orders it: the
layer timing of the cache kernel (:mod:`moesim.sim.fast.order`).

Every load is a whole expert and takes the same time, so loads land in the order they were
issued and only times and creation orders need keeping: no heap, no unit objects, the same
floating-point operations in the same order as the event loop. :func:`one_lane_loads` is
:func:`compute_while_loading` for one copy lane and experts of one cost (the catalog's
hardware, one token per step), which the kernel's speed rests on.
"""

from __future__ import annotations


def compute_while_loading(now: float, stall: float, gpu: float, h: int, m: int, n_lanes: int,
                          d: float, sums: list[float], hit_s: float = 0.0,
                          costs: list[float] | None = None) -> tuple[float, float, float]:
    """A layer of ``h`` resident experts and ``m >= 1`` demand loads of ``d`` seconds each on
    ``n_lanes`` copy lanes, issued at ``now`` in access order. Returns the new time, stall and
    GPU busy time (``gpu`` plus this layer's compute, added batch by batch in the same order).

    The GPU computes what is resident in batches, ready ones first: the resident experts at
    once, the loaded ones as they land. With ``costs`` None every expert costs the same
    (``sums[c]`` is the cost of ``c`` of them, summed as the event loop sums them); else
    ``hit_s`` is the resident experts' cost and ``costs`` each loaded expert's (access order).

    Load ``j`` starts at once on a free lane or when load ``j - n_lanes`` lands (the lanes hand
    out their lowest free id), so loads land in index order; ``T[j]`` and ``Q[j]`` are its
    landing time and creation order (SimPy's tie order: a GPU timeout created before a landing
    at the same instant comes first)."""
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
            # (the first batch holds the resident experts only: nothing has landed yet)
            dt = sums[c] if costs is None else hit_s if left else sum(costs[done:landed])
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
    """:func:`compute_while_loading` on one copy lane for experts that all cost the same (the catalog's hardware): the loads land one
    after another, each issued when the one before lands, so only the load in flight matters:
    it lands at ``t_next``; it was issued before the GPU's current timeout unless a landing
    processed after that timeout was created issued it (then only an earlier time comes first)."""
    t_next = now + d
    if m == 2 and not h and t_next + d != t_next:   # two loads landing apart, nothing resident: the loop below, unrolled
        stall += t_next - now
        now = t_next + sums[1]
        gpu += sums[1]
        t_next = t_next + d
        if t_next > now:   # the second lands after the first computed: wait for it
            stall += t_next - now
            now = t_next
        return now + sums[1], stall, gpu + sums[1]
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
