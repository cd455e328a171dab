"""The copy lanes' queue after re-prioritisations and withdrawals (sim/engine/lanes.py): the heap
array itself, not only the pop order, is what rebuilding it with ``heapq.heapify`` after each
change gives (withdrawals hand the policy its ``on_cancel`` calls in array order), whether or
not a re-prioritisation changes the priority."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import simpy
from hypothesis import given
from hypothesis import strategies as st

from moesim.sim.engine.lanes import DEMAND_CLASS, PREFETCH_CLASS, CopyLanes

QUEUED, INFLIGHT = 1, 2


@dataclass(eq=False)
class _U:
    nbytes: int
    key: Any
    state: int = 0
    event: simpy.Event | None = None


ops = st.lists(st.tuples(st.sampled_from(["submit", "demand", "reprio", "cancel"]), st.integers(0, 30),
                         st.sampled_from([0.0, 1.0, 2.0, 2.5, 7.0])), max_size=60)


@given(ops)
def test_queue_is_the_heapified_rebuild(steps: list[tuple[str, int, float]]) -> None:
    lanes = CopyLanes(simpy.Environment(), 1, lambda n: 1.0, lambda u, c, lane: None,
                      lambda u, c, lane, s, d: None, queued=QUEUED, inflight=INFLIGHT)
    lanes.submit(_U(1, "busy"), DEMAND_CLASS)   # the one lane is busy: every later submit queues
    ref: list[tuple[int, float, int, Any, int]] = []
    units: list[_U] = []
    for op, n, prio in steps:
        if op in ("submit", "demand"):
            u = _U(1, len(units))
            units.append(u)
            cls = DEMAND_CLASS if op == "demand" else PREFETCH_CLASS
            lanes.submit(u, cls, prio)
            heapq.heappush(ref, (cls, -prio, lanes._seq, u, cls))
        elif op == "reprio" and units:
            u = units[n % len(units)]
            hit = [i for i, e in enumerate(ref) if e[3] is u and e[4] != DEMAND_CLASS and u.state == QUEUED]
            assert lanes.reprioritize(u, prio) == bool(hit)
            if hit:
                e = ref[hit[0]]
                ref[hit[0]] = (e[0], -prio, e[2], u, e[4])
                heapq.heapify(ref)
        elif op == "cancel":
            dropped = lanes.cancel(lambda u, cls, r=n % 3: cls == DEMAND_CLASS or u.key % 3 != r)
            gone = [e[3] for e in ref if e[4] != DEMAND_CLASS and e[3].key % 3 == n % 3]
            assert dropped == gone
            if gone:
                ref = [e for e in ref if e[3] not in gone]
                heapq.heapify(ref)
            for u in gone:   # withdrawn, as Withdrawals._drop_queued marks them
                u.state = 0
        assert lanes.queue == ref
