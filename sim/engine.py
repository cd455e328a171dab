"""The SimPy model: one GPU compute stream, host-to-device copy lanes and the expert VRAM budget.

Semantics (DESIGN.md section 5), per iteration and MoE layer ``l``:

1. ``policy.before_layer`` (evict, prefetch, cancel queued prefetches);
2. non-MoE compute of ``l`` on the GPU stream;
3. routing of ``l`` becomes known; ``policy.plan`` says which experts run;
4. each planned expert part is resident (hit), issued (late: queued or in flight) or absent
   (demand load, queued ahead of every prefetch; a transfer in flight is never cancelled);
   ``policy.after_layer`` runs now, so its prefetches for later layers overlap the compute;
5. expert parts compute on the GPU stream as they become resident, ready ones first; each part
   of a planned expert stays pinned until it has computed in this layer (so a computed top
   segment can make room for its own bottom when memory is tight).

VRAM: a unit (an expert, or a segment of one) holds its bytes from the moment its transfer is
issued until it is evicted, in the pool of its layer (or the one global pool), or in the
shared transfer buffer (``cache.buffer_experts``) when its pool has no room. Victims come from
the policy among unpinned residents; a demand load that finds no room waits (a stall), after
the engine has cancelled queued prefetches of that pool. The budget is never exceeded.

Eviction drops the copy by default (weights are read-only and the host keeps them). With
``swap_out`` (``cache.swap_out``) an evicted unit is copied back to the host over the D2H lane
(``hardware.d2h_gbps``) and its room is free only when that copy lands: a demand load that had
to evict waits for the swap-out as well, which is the evict-then-fetch coupling of ActiveEvict;
a prefetch whose room is still draining waits for it (state ``WAITING``) and becomes a demand
load if its layer is routed first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from moesim.policies.base import HIT, LATE, MISS, PARTIAL, Outcome, Policy, Routing, UnitKey
from moesim.sim.cost import CostModel
from moesim.sim.errors import MoesimError
from moesim.sim.pcie import DEMAND_CLASS, PREFETCH_CLASS, CopyLanes
from moesim.sim.workload import Future, Iteration, Workload

# unit states
WAITING, QUEUED, INFLIGHT, RESIDENT = 1, 2, 3, 4
ABSENT = 0
SWAP_QUEUED, SWAPPING = 5, 6   # an evicted unit being copied back to the host (swap_out); not in ``units``



class CausalityError(RuntimeError):
    """A policy asked for information a real system would not have at that instant."""


class Unit:
    """An expert (or a segment of one) that is waiting for room, queued, in flight or resident."""

    __slots__ = ("key", "nbytes", "pool", "state", "event", "demand", "used", "in_buffer")

    def __init__(self, key: UnitKey, nbytes: int, pool: int, demand: bool) -> None:
        self.key = key
        self.nbytes = nbytes
        self.pool = pool
        self.state = WAITING
        self.event: simpy.Event | None = None   # made when someone waits for the transfer
        self.demand = demand
        self.used = False
        self.in_buffer = False


@dataclass
class SimContext:
    """Static context handed to ``policy.setup``."""

    model: Any               # sim.catalog.ModelSpec
    hardware: Any            # sim.catalog.HardwareSpec
    cost: CostModel
    num_layers: int
    num_experts: int
    top_k: int
    expert_bytes: int
    pool_capacity: list[int]  # bytes per pool (one per layer, or one global)
    buffer_bytes: int
    total_budget: int         # sum of pool capacities
    rng: np.random.Generator
    has_lookahead: bool
    has_weights: bool
    has_embedding: bool
    future: Future | None = None   # oracle policies only
    expert_frequency: np.ndarray | None = None   # [L, E] counts over the replayed workload (offline profile)


@dataclass
class StepRecord:
    iteration: int
    layer: int
    t_start: float
    t_route: float
    t_end: float
    n_experts: int
    hits: int
    late: int
    partial: int
    misses: int
    stall_s: float
    demand_bytes: int
    prefetch_bytes: int
    evictions: int


@dataclass
class RunStats:
    """Raw counters of one run; :mod:`sim.metrics` turns them into the reported metrics."""

    hits: int = 0
    late: int = 0
    partial: int = 0
    misses: int = 0
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    prefetch_units: int = 0
    prefetch_used: int = 0
    wasted_prefetch_bytes: int = 0
    refetch_bytes: int = 0
    fetch_needed: int = 0       # accesses whose expert was brought in since its previous access
    fetch_covered: int = 0      # ... of which by a prefetch
    evictions: int = 0
    stall_s: float = 0.0
    gpu_busy_s: float = 0.0
    pcie_busy_s: float = 0.0
    d2h_bytes: int = 0          # copied back to the host (swap_out)
    d2h_busy_s: float = 0.0
    vram_peak_bytes: int = 0
    substitutions: int = 0
    dropped: int = 0
    mass_kept_sum: float = 0.0
    token_layers: int = 0
    token_end: dict[int, list[float]] = field(default_factory=dict)   # request -> token times
    request_start: dict[int, float] = field(default_factory=dict)
    iteration_end: list[float] = field(default_factory=list)


class EngineView:
    """What a policy may see and do. Reads are limited to the present: the routing of layers
    already routed in the current iteration, their ``lookahead_logits``, and the past."""

    __slots__ = ("_e",)

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    # -- time and position -------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Simulated time in seconds."""
        return float(self._e.env.now)

    @property
    def iteration(self) -> Iteration:
        return self._e.cur_iter

    @property
    def iteration_index(self) -> int:
        return self._e.cur_iter.index

    @property
    def layer(self) -> int:
        """The layer being processed (-1 before layer 0 of the iteration)."""
        return self._e.cur_layer

    @property
    def num_layers(self) -> int:
        return self._e.L

    # -- present and past routing -------------------------------------------------------------
    def routing(self, layer: int) -> Routing:
        """Routing of ``layer`` in the current iteration; only once it is known."""
        e = self._e
        if layer > e.routed_upto:
            raise CausalityError(f"routing of layer {layer} is not known yet (now at layer {e.cur_layer})")
        return e.routing_of(e.cur_iter, layer)

    def lookahead_logits(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` logits of router ``layer + 1`` (router 0 at the last layer) applied
        to the router input of ``layer``; available once ``layer`` is routed."""
        e = self._e
        if layer > e.routed_upto:
            raise CausalityError(f"lookahead of layer {layer} is not known yet (now at layer {e.cur_layer})")
        la = e.trace.lookahead_logits
        if la is None:
            return None
        return la[e.rows_of(e.cur_iter, layer)]

    def previous_lookahead_logits(self) -> np.ndarray | None:
        """Lookahead of the last layer of the previous iteration (router 0 applied to it): a
        cross-token prediction for layer 0, available at the start of an iteration. Tokens of
        the previous iteration, so its batch may differ in size."""
        e = self._e
        la = e.trace.lookahead_logits
        if la is None or e.prev_iter is None:
            return None
        return la[e.rows_of(e.prev_iter, e.L - 1)]

    def previous_routing(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, k]`` routing of ``layer`` in the previous iteration."""
        e = self._e
        if e.prev_iter is None:
            return None
        return e.trace.experts[e.rows_of(e.prev_iter, layer)]

    def embedding(self) -> np.ndarray | None:
        """Semantic embedding of the current iteration (known at its start), if the trace has one."""
        e = self._e
        it = e.cur_iter
        if it.emb_row < 0 or e.trace.embedding is None or e.emb_index is None:
            return None
        idx = e.emb_index.get(it.emb_row)
        return None if idx is None else e.trace.embedding[idx]

    # -- residency --------------------------------------------------------------------------
    def state(self, layer: int, expert: int, part: int = 0) -> int:
        """``ABSENT`` (0), ``WAITING``, ``QUEUED``, ``INFLIGHT`` or ``RESIDENT``."""
        u = self._e.units.get((layer, expert, part))
        return ABSENT if u is None else u.state

    def is_resident(self, layer: int, expert: int) -> bool:
        """All parts of the expert are resident."""
        e = self._e
        for p in range(len(e.fractions[layer])):
            u = e.units.get((layer, expert, p))
            if u is None or u.state != RESIDENT:
                return False
        return True

    def is_present(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit is resident or issued (waiting, queued, in flight)."""
        return (layer, expert, part) in self._e.units

    def resident_units(self, pool: int | None = None) -> list[UnitKey]:
        e = self._e
        src = e.units.items() if pool is None else e.pool_units[pool].items()
        return [k for k, u in src if u.state == RESIDENT]

    def units_of_layer(self, layer: int) -> list[UnitKey]:
        return [k for k in self._e.units if k[0] == layer]

    def pinned(self, layer: int, expert: int) -> bool:
        """Some part of the expert is pinned: planned for the current layer, not yet computed."""
        pins = self._e.pinned
        return any((layer, expert, p) in pins for p in range(len(self._e.fractions[layer])))

    def pool_of(self, layer: int) -> int:
        return self._e.pool_of(layer)

    def capacity(self, pool: int) -> int:
        return self._e.capacity[pool]

    def used(self, pool: int) -> int:
        return self._e.used[pool]

    def free(self, pool: int) -> int:
        return self._e.capacity[pool] - self._e.used[pool]

    def part_bytes(self, layer: int, part: int = 0) -> int:
        return self._e.part_bytes(layer, part)

    def buffer_free(self) -> int:
        """Free bytes in the transfer buffer (``cache.buffer_experts``)."""
        return self._e.buffer_capacity - self._e.buffer_used

    def in_buffer(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit is present and holds room in the transfer buffer rather than in its pool."""
        u = self._e.units.get((layer, expert, part))
        return u is not None and u.in_buffer

    # -- actions ------------------------------------------------------------------------------
    def prefetch(self, layer: int, expert: int, part: int = 0, priority: float = 0.0,
                 into_buffer: bool = False) -> bool:
        """Queue a prefetch (behind every demand load; higher ``priority`` first). It takes room
        now: from its pool (victims from ``choose_victim``), or the transfer buffer when
        ``into_buffer`` or the pool has none. Returns False, doing nothing, when the unit is
        already present or there is no room."""
        return self._e.issue_prefetch((layer, expert, part), priority, into_buffer)

    def evict(self, layer: int, expert: int, part: int = 0) -> bool:
        """Drop a resident, unpinned unit. Returns False if it is not such a unit."""
        return self._e.evict_key((layer, expert, part))

    def cancel_prefetches(self, layer: int | None = None) -> int:
        """Cancel queued (not yet started) prefetches, of ``layer`` or all; returns how many."""
        return self._e.cancel_queued(layer)

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the expert budget among layers (bytes per layer; the sum may not exceed the
        total). Only at an idle point (``on_iteration_end``/``setup``-time ``warm``) and only when
        each layer's current usage fits its new budget (evict first)."""
        self._e.set_layer_budgets(budgets)


class Engine:
    """Replays a :class:`~sim.workload.Workload` under a policy. Build, then :meth:`run`."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        cost: CostModel,
        *,
        budget_bytes: int,
        buffer_bytes: int = 0,
        initial: str = "empty",
        swap_out: bool = False,
        seed: int = 0,
        record_timeline: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        tr = workload.trace
        m = tr.model
        self.workload, self.trace, self.policy, self.cost = workload, tr, policy, cost
        self.L, self.E, self.K = m.num_layers, m.num_experts, m.top_k
        self.expert_bytes = cost.expert_bytes
        self.env = simpy.Environment()
        self.view = EngineView(self)
        self.record_timeline = record_timeline
        self.timeline: list[tuple[str, str, float, float, dict[str, Any]]] = []
        self.progress = progress
        self.initial = initial
        ss = np.random.SeedSequence(seed)
        pol_seed, eng_seed = ss.spawn(2)
        self.rng = np.random.default_rng(eng_seed)

        if policy.scope not in ("layer", "global"):
            raise MoesimError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        self.global_pool = policy.scope == "global"
        if self.global_pool:
            self.capacity = [int(budget_bytes)]
        else:
            per = int(budget_bytes) // self.L
            self.capacity = [per] * self.L
        self.used = [0] * len(self.capacity)
        self.pool_units: list[dict[UnitKey, Unit]] = [{} for _ in self.capacity]
        self.buffer_capacity = int(buffer_bytes)
        self.buffer_used = 0
        self.fractions: list[tuple[float, ...]] = [(1.0,)] * self.L

        self.units: dict[UnitKey, Unit] = {}
        self.pinned: set[UnitKey] = set()   # units planned for the current layer, not yet computed
        self.waiting: list[Unit] = []              # demand units waiting for room, in order
        self.lanes = CopyLanes(self.env, cost.hardware.copy_engines, cost.transfer_s,
                               self._on_transfer_start, self._on_transfer_land,
                               queued=QUEUED, inflight=INFLIGHT)
        # swap_out: one D2H lane; bytes of evicted units still being copied back, per pool and buffer
        self.d2h = (CopyLanes(self.env, 1, cost.d2h_transfer_s, lambda u, c, lane: None,
                              self._on_swap_land, queued=SWAP_QUEUED, inflight=SWAPPING)
                    if swap_out else None)
        self.draining = [0] * len(self.capacity)
        self.claimed = [0] * len(self.capacity)   # ... of which waiting prefetches count on
        self.buffer_draining = 0
        self.waiting_prefetch: list[tuple[Unit, float]] = []   # (unit, priority) waiting for draining room
        self.space_event = self.env.event()
        self.last_evict_iter: dict[UnitKey, int] = {}
        self.stats = RunStats()
        self._steps: list[tuple[Any, ...]] = []   # StepRecord fields, as tuples on the hot path
        self._layer_evictions = 0
        self._layer_prefetch_bytes = 0
        self.cur_layer = -1
        self.routed_upto = -1
        self.cur_iter = workload.iterations[0]
        self.prev_iter: Iteration | None = None
        self.emb_index = (
            {int(r): i for i, r in enumerate(tr.embedding_rows)} if tr.embedding_rows is not None else None
        )
        self.freq: np.ndarray | None = None
        self._has_on_loaded = type(policy).on_loaded is not Policy.on_loaded

        self.ctx = SimContext(
            model=cost.model, hardware=cost.hardware, cost=cost, num_layers=self.L,
            num_experts=self.E, top_k=self.K, expert_bytes=self.expert_bytes,
            pool_capacity=list(self.capacity), buffer_bytes=self.buffer_capacity,
            total_budget=sum(self.capacity), rng=np.random.default_rng(pol_seed),
            has_lookahead=tr.lookahead_logits is not None, has_weights=tr.weights is not None,
            has_embedding=tr.embedding is not None,
            future=workload.future() if policy.oracle else None,
        )

    # ------------------------------------------------------------------------------------------
    # helpers
    def pool_of(self, layer: int) -> int:
        return 0 if self.global_pool else layer

    def part_bytes(self, layer: int, part: int) -> int:
        fr = self.fractions[layer]
        if not 0 <= part < len(fr):
            raise ValueError(f"layer {layer} has {len(fr)} part(s); no part {part}")
        return int(round(fr[part] * self.expert_bytes))

    @staticmethod
    def rows_of(it: Iteration, layer: int) -> slice | np.ndarray:
        """Trace rows of ``layer`` for the tokens of ``it`` (a slice when there is one token:
        numpy views are much cheaper than fancy indexing on the hot path)."""
        if it.rows0.shape[0] == 1:
            r = int(it.rows0[0]) + layer
            return slice(r, r + 1)
        return it.rows0 + layer

    def routing_of(self, it: Iteration, layer: int) -> Routing:
        rows = self.rows_of(it, layer)
        w = self.trace.weights
        return Routing(layer, self.trace.experts[rows], None if w is None else w[rows])

    def _landing(self, u: Unit) -> simpy.Event:
        """The event that fires when ``u``'s transfer lands (made on first demand: most
        transfers land before anyone waits, and an untriggered event costs nothing)."""
        if u.event is None:
            u.event = self.env.event()
        return u.event

    @property
    def steps(self) -> list[StepRecord]:
        """Per (iteration, layer) records, in order."""
        return [StepRecord(*t) for t in self._steps]

    def _add_unit(self, u: Unit) -> None:
        self.units[u.key] = u
        self.pool_units[u.pool][u.key] = u

    def _remove_unit(self, u: Unit) -> None:
        del self.units[u.key]
        del self.pool_units[u.pool][u.key]

    def _total_used(self) -> int:
        return sum(self.used) + self.buffer_used

    def _note_peak(self) -> None:
        tot = self._total_used()
        if tot > self.stats.vram_peak_bytes:
            self.stats.vram_peak_bytes = tot

    def _release(self, u: Unit) -> None:
        if u.in_buffer:
            self.buffer_used -= u.nbytes
        else:
            self.used[u.pool] -= u.nbytes
        if not self.space_event.triggered:
            self.space_event.succeed()

    def _candidates(self, pool: int) -> list[UnitKey]:
        pinned = self.pinned
        return [k for k, u in self.pool_units[pool].items()
                if u.state == RESIDENT and not u.in_buffer and k not in pinned]

    def _drop(self, u: Unit) -> None:
        """``u`` leaves VRAM: free its room (at once, or when its swap-out lands), account a
        prefetch that was never used, remember when (for refetch accounting) and tell the policy."""
        self._remove_unit(u)
        if self.d2h is None:
            self._release(u)
        else:
            if u.in_buffer:
                self.buffer_draining += u.nbytes
            else:
                self.draining[u.pool] += u.nbytes
            u.event = None
            self.d2h.submit(u, DEMAND_CLASS)
        if not u.used and not u.demand:
            self.stats.wasted_prefetch_bytes += u.nbytes
        self.last_evict_iter[u.key] = self.cur_iter.index
        self.policy.on_evict(self.view, u.key)

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        u = self.units.get(key)
        if u is None or u.state != RESIDENT or key in self.pinned:
            return False
        self.stats.evictions += 1
        self._layer_evictions += 1
        self._drop(u)
        return True

    def _make_room(self, pool: int, nbytes: int) -> tuple[bool, int]:
        """Evict policy-chosen victims until ``nbytes`` fit in ``pool``, counting room still
        draining to the host as coming; returns (fits now, evictions)."""
        n = 0
        cap, used = self.capacity, self.used
        while self._room_to_come(pool) < nbytes:
            cands = self._candidates(pool)
            if not cands:
                break
            victim = self.policy.choose_victim(self.view, pool, cands, nbytes - (cap[pool] - used[pool]))
            if victim is None:
                break
            if not self.evict_key(victim):
                raise MoesimError(f"policy {self.policy.name!r} chose victim {victim}, which is not an unpinned resident")
            n += 1
        return cap[pool] - used[pool] >= nbytes, n

    def _room_to_come(self, pool: int) -> int:
        """Bytes of ``pool`` free now or draining to the host, less what waiting prefetches claim."""
        return self.capacity[pool] - self.used[pool] + self.draining[pool] - self.claimed[pool]

    def _take_room(self, u: Unit, allow_buffer: bool) -> bool:
        """Give ``u`` room that is free now, without evicting: in its pool, else (with
        ``allow_buffer``) in the transfer buffer. False if neither has it."""
        if self.capacity[u.pool] - self.used[u.pool] >= u.nbytes:
            self.used[u.pool] += u.nbytes
        elif allow_buffer and self.buffer_capacity - self.buffer_used >= u.nbytes:
            u.in_buffer = True
            self.buffer_used += u.nbytes
        else:
            return False
        if self.used[u.pool] > self.capacity[u.pool] or self.buffer_used > self.buffer_capacity:
            raise AssertionError("VRAM budget exceeded")  # invariant; never expected
        self._note_peak()
        return True

    def _allocate(self, u: Unit, allow_buffer: bool) -> tuple[bool, int]:
        """Evict for ``u`` as needed, then give it room; returns (got room, evictions)."""
        n = self._make_room(u.pool, u.nbytes)[1]
        return self._take_room(u, allow_buffer), n

    def _enqueue(self, u: Unit, cls: int, prio: float) -> None:
        self.lanes.submit(u, cls, prio)

    def _on_transfer_start(self, u: Unit, cls: int, lane: int) -> None:
        st = self.stats
        refetched = self.last_evict_iter.get(u.key)
        if refetched is not None and self.cur_iter.index - refetched <= 1:
            st.refetch_bytes += u.nbytes
        if cls == DEMAND_CLASS:
            st.demand_bytes += u.nbytes
        else:
            st.prefetch_bytes += u.nbytes
            st.prefetch_units += 1
            self._layer_prefetch_bytes += u.nbytes

    def _label(self, key: UnitKey) -> str:
        """A transfer's name on the timeline: ``L3 E5``, or ``L3 E5.1`` for a segment."""
        return f"L{key[0]} E{key[1]}" + (f".{key[2]}" if len(self.fractions[key[0]]) > 1 else "")

    def _on_swap_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        """An evicted unit's copy-back landed on the host: its room is free now."""
        if u.in_buffer:
            self.buffer_draining -= u.nbytes
        else:
            self.draining[u.pool] -= u.nbytes
        u.state = ABSENT
        st = self.stats
        st.d2h_bytes += u.nbytes
        st.d2h_busy_s += dur
        if self.record_timeline:
            self.timeline.append(("PCIe D2H", self._label(u.key), start, dur, {"bytes": u.nbytes}))
        self._release(u)
        if self.waiting_prefetch:
            self._grant_prefetches()

    def _grant_prefetches(self) -> None:
        """Queue the prefetches that waited for draining room, in order, where room is free
        now; demand loads waiting for the same pool come first."""
        left: list[tuple[Unit, float]] = []
        demand_pools = {w.pool for w in self.waiting}
        for u, prio in self.waiting_prefetch:
            if u.pool in demand_pools or not self._take_room(u, allow_buffer=True):
                left.append((u, prio))
                continue
            self.claimed[u.pool] -= u.nbytes
            self._enqueue(u, PREFETCH_CLASS, prio)
        self.waiting_prefetch = left

    def _on_transfer_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        u.state = RESIDENT
        self.stats.pcie_busy_s += dur
        key = u.key
        if self.record_timeline:
            self.timeline.append((f"PCIe H2D {lane}", self._label(key), start, dur,
                                  {"demand": cls == DEMAND_CLASS, "bytes": u.nbytes}))
        if self._has_on_loaded:
            self.policy.on_loaded(self.view, key, cls == DEMAND_CLASS)
        if self.waiting and not self.space_event.triggered:
            self.space_event.succeed()   # the landed unit may now be evicted for a waiting demand load

    # ------------------------------------------------------------------------------------------
    # prefetch / demand
    def issue_prefetch(self, key: UnitKey, priority: float, into_buffer: bool) -> bool:
        if key in self.units:
            return False
        layer, expert, part = key
        if not (0 <= layer < self.L and 0 <= expert < self.E):
            raise ValueError(f"no expert {expert} in layer {layer}")
        nbytes = self.part_bytes(layer, part)
        pool = self.pool_of(layer)
        u = Unit(key, nbytes, pool, False)
        if self.waiting and any(w.pool == pool for w in self.waiting):
            return False  # demand loads waiting for room in this pool come first
        if into_buffer:
            if self.buffer_capacity - self.buffer_used < nbytes:
                return False
            u.in_buffer = True
            self.buffer_used += nbytes
            self._note_peak()
        else:
            ok, _ = self._allocate(u, allow_buffer=True)
            if not ok:
                if self._room_to_come(pool) < nbytes:
                    return False
                # its room is being copied back to the host (swap_out): claim it and wait
                self.claimed[pool] += nbytes
                self._add_unit(u)
                self.waiting_prefetch.append((u, priority))
                return True
        self._add_unit(u)
        self._enqueue(u, PREFETCH_CLASS, priority)
        return True

    def _drop_queued(self, keep: Callable[[Unit], bool]) -> int:
        """Cancel queued prefetches for which ``keep`` is False; never a demand load, never a
        pinned unit."""
        pinned = self.pinned
        dropped = self.lanes.cancel(
            lambda u, cls: cls != PREFETCH_CLASS or u.key in pinned or keep(u))
        for u in dropped:
            u.state = ABSENT
            self._remove_unit(u)
            self._release(u)
        if self.waiting_prefetch:   # they hold no room yet
            left = []
            for u, prio in self.waiting_prefetch:
                if u.key in pinned or keep(u):
                    left.append((u, prio))
                else:
                    self._withdraw(u)
                    dropped.append(u)
            self.waiting_prefetch = left
        for u in dropped:
            self.policy.on_cancel(self.view, u.key)
        return len(dropped)

    def _withdraw(self, u: Unit) -> None:
        """Forget a prefetch waiting for draining room (it holds no room, only its claim); the
        caller takes it off ``waiting_prefetch`` and tells the policy."""
        u.state = ABSENT
        self._remove_unit(u)
        self.claimed[u.pool] -= u.nbytes

    def _demand_instead(self, u: Unit) -> None:
        """A prefetch still waiting for draining room when its layer is routed: withdraw it;
        the caller loads the unit on demand."""
        self.waiting_prefetch = [x for x in self.waiting_prefetch if x[0] is not u]
        self._withdraw(u)
        self.policy.on_cancel(self.view, u.key)

    def cancel_queued(self, layer: int | None) -> int:
        """Cancel queued prefetches of ``layer`` (all layers if None)."""
        return self._drop_queued(lambda u: layer is not None and u.key[0] != layer)

    def _try_waiting(self) -> tuple[list[Unit], float]:
        """Give room to waiting demand units, in order. Returns the units that got room (to be
        queued once the eviction delay on the critical path, also returned, has passed)."""
        delay = 0.0
        evict_s = self.cost.hardware.evict_us * 1e-6
        granted: list[Unit] = []
        while self.waiting:
            u = self.waiting[0]
            ok, n = self._allocate(u, allow_buffer=True)
            if not ok and self.cancel_queued_pool(u.pool):
                ok, n2 = self._allocate(u, allow_buffer=True)
                n += n2
            delay += n * evict_s
            if not ok:
                break
            self.waiting.pop(0)
            u.state = QUEUED
            granted.append(u)
        return granted, delay

    def _issue_demand(self) -> Any:
        """Process fragment: grant room to waiting demand loads, pay the eviction cost on the
        critical path, then queue the loads. Returns the stall it caused (seconds)."""
        granted, delay = self._try_waiting()
        if delay > 0:
            yield self.env.timeout(delay)
        for u in granted:
            self._enqueue(u, DEMAND_CLASS, 0.0)
        return delay

    def cancel_queued_pool(self, pool: int) -> int:
        """Cancel queued prefetches holding room in ``pool`` (not in the buffer), so that a
        waiting demand load can take it."""
        return self._drop_queued(lambda u: u.pool != pool or u.in_buffer)

    def set_layer_budgets(self, budgets: list[int]) -> None:
        if self.global_pool:
            raise MoesimError(f"policy {self.policy.name!r} has one global pool; it cannot set per-layer budgets")
        if len(budgets) != self.L:
            raise ValueError(f"need {self.L} layer budgets, got {len(budgets)}")
        total = sum(self.ctx.pool_capacity)
        if sum(int(b) for b in budgets) > total:
            raise ValueError(f"layer budgets sum to {sum(budgets)} bytes, over the total {total}")
        for layer, b in enumerate(budgets):
            if self.used[layer] > int(b):
                raise ValueError(f"layer {layer} uses {self.used[layer]} bytes, over its new budget {int(b)}: evict first")
        self.capacity = [int(b) for b in budgets]

    def set_fractions(self, layer: int, fractions: tuple[float, ...]) -> None:
        if abs(sum(fractions) - 1.0) > 1e-9 or any(f < 0 for f in fractions):
            raise ValueError(f"part fractions of layer {layer} must be >= 0 and sum to 1, got {fractions}")
        if fractions != self.fractions[layer] and any(k[0] == layer for k in self.units):
            raise ValueError(f"layer {layer} changes its split while units are present: evict them first")
        self.fractions[layer] = fractions

    # ------------------------------------------------------------------------------------------
    # processes
    def _initial_fill(self) -> None:
        if self.initial == "empty":
            return
        L, E = self.L, self.E
        placed: list[UnitKey] = []
        for layer in range(L):
            if self.initial == "popular":
                assert self.freq is not None
                order = np.argsort(-self.freq[layer], kind="stable")
            elif self.initial == "random":
                order = self.rng.permutation(E)
            else:
                raise MoesimError(f"cache.initial: unknown value {self.initial!r} (empty, popular or random)")
            for e in order:
                for p in range(len(self.fractions[layer])):
                    key = (layer, int(e), p)
                    nbytes = self.part_bytes(layer, p)
                    pool = self.pool_of(layer)
                    cap_share = self.capacity[pool] if not self.global_pool else self.capacity[0] // L * (layer + 1)
                    if self.used[pool] + nbytes > min(self.capacity[pool], cap_share):
                        break
                    u = Unit(key, nbytes, pool, True)
                    u.state = RESIDENT
                    u.used = True
                    self.used[pool] += nbytes
                    self._add_unit(u)
                    placed.append(key)
        self._note_peak()
        self.policy.warm(self.view, placed)

    def _gpu(self) -> Any:
        env = self.env
        cost = self.cost
        L = self.L
        st = self.stats
        policy = self.policy
        view = self.view
        tr = self.trace
        weights = tr.weights
        units = self.units
        pinned = self.pinned
        timeline = self.timeline if self.record_timeline else None
        iters = self.workload.iterations
        n_iters = len(iters)
        batch_start: dict[int, float] = {}
        exp_cost: dict[int, float] = {}
        # skip the calls of hooks a policy does not override (the hot path runs per layer)
        cls = type(policy)
        has_before = cls.before_layer is not Policy.before_layer
        has_plan = cls.plan is not Policy.plan
        has_after = cls.after_layer is not Policy.after_layer
        timeout = env.timeout
        for it in iters:
            self.cur_iter = it
            self.cur_layer = -1
            self.routed_upto = -1
            if it.batch not in batch_start:
                batch_start[it.batch] = env.now
            for r, first in zip(it.request_ids.tolist(), it.first_of_request.tolist(), strict=True):
                if first:
                    st.request_start[int(r)] = batch_start[it.batch]
            policy.on_iteration_start(view)
            n_tok = it.n_tokens
            layer_s = cost.layer_s(n_tok)
            for layer in range(L):
                self.cur_layer = layer
                self._layer_evictions = 0
                self._layer_prefetch_bytes = 0
                t0 = env.now
                if has_before:
                    policy.before_layer(view, layer)
                # 2. non-MoE compute
                yield timeout(layer_s)
                st.gpu_busy_s += layer_s
                if timeline is not None:
                    timeline.append(("GPU", f"L{layer} attn", t0, layer_s, {"iteration": it.index}))
                # 3. routing known, plan
                self.routed_upto = layer
                t_route = env.now
                routing = self.routing_of(it, layer)
                plan = policy.plan(view, layer, routing) if has_plan else None
                if plan is None:
                    plan_m = routing.experts
                else:
                    plan_m = np.asarray(plan)
                    if plan_m.shape != routing.experts.shape:
                        raise MoesimError(f"policy {policy.name!r} returned a plan of shape {plan_m.shape}, expected {routing.experts.shape}")
                    self._lossy_stats(routing, plan_m, weights is not None)
                # executed experts in access order and their token counts
                flat = plan_m.reshape(-1)
                if n_tok == 1:
                    exps = [x for x in flat.tolist() if x >= 0]
                    counts = [1] * len(exps)
                else:
                    valid = flat[flat >= 0]
                    uniq, first, cnt = np.unique(valid, return_index=True, return_counts=True)
                    order = np.argsort(first, kind="stable")
                    exps = [int(x) for x in uniq[order]]
                    counts = [int(x) for x in cnt[order]]
                fr = self.fractions[layer]
                nparts = len(fr)
                pool = 0 if self.global_pool else layer
                status: list[int] = []
                need: list[tuple[int, float, Unit]] = []  # (expert index, compute seconds, unit)
                miss_units: list[Unit] = []
                hits = late = part = miss = miss_bytes = 0
                for e in exps:
                    for p in range(nparts):
                        pinned.add((layer, e, p))
                for i, e in enumerate(exps):
                    c = counts[i]
                    t_exp = exp_cost.get(c)
                    if t_exp is None:
                        t_exp = exp_cost[c] = cost.expert_s(c)
                    n_res = n_abs = 0
                    fetched = covered = False
                    for p in range(nparts):
                        key = (layer, e, p)
                        u = units.get(key)
                        if u is not None and u.state == WAITING and not u.demand:
                            self._demand_instead(u)
                            u = None
                        if u is None:
                            n_abs += 1
                            u = Unit(key, self.part_bytes(layer, p), pool, True)
                            self._add_unit(u)
                            miss_units.append(u)
                            miss_bytes += u.nbytes
                        elif u.state == RESIDENT:
                            n_res += 1
                        if not u.used:
                            # brought in since its previous use: by a prefetch, or on demand
                            fetched = True
                            if not u.demand:
                                covered = True
                                st.prefetch_used += 1
                            u.used = True
                        need.append((i, t_exp * fr[p], u))
                    if n_res == nparts:
                        status.append(HIT)
                        hits += 1
                    elif n_abs == 0:
                        status.append(LATE)
                        late += 1
                    elif n_res:
                        status.append(PARTIAL)
                        part += 1
                    else:
                        status.append(MISS)
                        miss += 1
                    if fetched:
                        st.fetch_needed += 1
                        if covered:
                            st.fetch_covered += 1
                st.hits += hits
                st.late += late
                st.partial += part
                st.misses += miss
                # 4. demand loads for absent parts, ahead of queued prefetches
                stall = 0.0
                if miss_units:
                    self.waiting.extend(miss_units)
                if self.waiting:
                    stall += yield from self._issue_demand()
                if has_after:
                    policy.after_layer(view, layer, Outcome(layer, routing, plan_m, exps, status))
                # 5. compute parts as they become resident, ready ones first
                remaining = need
                while remaining:
                    ready = [x for x in remaining if x[2].state == RESIDENT]
                    if ready:
                        if self.waiting:
                            ready = ready[:1]   # memory is tight: free pins one expert at a time
                        dt = sum([x[1] for x in ready])
                        tc = env.now
                        yield timeout(dt)
                        st.gpu_busy_s += dt
                        if timeline is not None:
                            timeline.append(("GPU", f"L{layer} experts", tc, dt,
                                             {"experts": [exps[x[0]] for x in ready]}))
                        if len(ready) == len(remaining):
                            remaining = []
                        else:
                            done = set(id(x) for x in ready)
                            remaining = [x for x in remaining if id(x) not in done]
                        for x in ready:
                            bu = x[2]
                            pinned.discard(bu.key)
                            if bu.in_buffer:   # free the staging room at once
                                self._settle(bu)
                        if self.waiting:
                            stall += yield from self._issue_demand()
                        continue
                    # nothing ready: wait for a transfer, or for room
                    ts = env.now
                    evs = [self._landing(x[2]) for x in remaining if x[2].state in (QUEUED, INFLIGHT)]
                    if evs:
                        yield evs[0] if len(evs) == 1 else env.any_of(evs)
                    elif self.waiting:
                        if self.space_event.triggered:   # room was freed since we last tried
                            self.space_event = env.event()
                            yield from self._issue_demand()
                        else:
                            self._check_deadlock(layer)
                            yield self.space_event
                    else:  # pragma: no cover - every remaining unit is resident, queued, in flight or waiting
                        raise AssertionError("expert part neither present nor waiting")
                    stall += env.now - ts
                pinned.clear()
                st.stall_s += stall
                if self.buffer_used:
                    self._settle_buffer(layer)
                self._steps.append((it.index, layer, t0, t_route, env.now, len(exps), hits, late,
                                    part, miss, stall, miss_bytes, self._layer_prefetch_bytes,
                                    self._layer_evictions))
            head = cost.head_s(n_tok)
            if head > 0:
                yield env.timeout(head)
                st.gpu_busy_s += head
            now = env.now
            st.iteration_end.append(now)
            for r in dict.fromkeys(it.request_ids.tolist()):   # one output token per request
                st.token_end.setdefault(int(r), []).append(now)
            self.cur_layer = L
            policy.on_iteration_end(view)
            self._apply_fractions()
            self.prev_iter = it
            if self.progress is not None:
                self.progress(it.index + 1, n_iters)

    def _check_deadlock(self, layer: int) -> None:
        busy = (any(u.state in (QUEUED, INFLIGHT) for u in self.units.values())
                or any(self.draining) or self.buffer_draining > 0)
        if not busy:
            u = self.waiting[0]
            raise MoesimError(
                f"the expert budget is too small: layer {layer} needs {u.nbytes} bytes for expert "
                f"{u.key[1]} but its pool holds {self.capacity[u.pool]} bytes and policy "
                f"{self.policy.name!r} can evict none of them (pinned or refused); raise "
                "cache.rate or cache.buffer_experts")

    def _settle(self, u: Unit) -> None:
        """A resident unit in the transfer buffer whose layer is done with it: it moves into its
        pool if the policy admits it and room can be made, else it is dropped."""
        key = u.key
        if self.policy.admit(self.view, key) and self._make_room(u.pool, u.nbytes)[0]:
            self.buffer_used -= u.nbytes
            self.used[u.pool] += u.nbytes
            u.in_buffer = False
        else:
            self._drop(u)

    def _settle_buffer(self, layer: int) -> None:
        """After ``layer`` computed, settle its resident units still in the transfer buffer."""
        if not self.buffer_used:
            return
        for key, u in list(self.units.items()):
            if u.in_buffer and u.state == RESIDENT and key[0] == layer:
                self._settle(u)

    def _apply_fractions(self) -> None:
        for layer in range(self.L):
            fr = tuple(float(f) for f in self.policy.part_fractions(layer))
            if fr != self.fractions[layer]:
                self.set_fractions(layer, fr)

    def _lossy_stats(self, routing: Routing, plan: np.ndarray, has_w: bool) -> None:
        st = self.stats
        orig = routing.experts
        n, k = orig.shape
        st.dropped += int((plan < 0).sum())
        # substitutions: experts that run but were not routed to that token
        for t in range(n):
            o = set(orig[t].tolist())
            ran = [x for x in plan[t].tolist() if x >= 0]
            st.substitutions += sum(1 for x in ran if x not in o)
            w = routing.weights[t] if has_w and routing.weights is not None else np.ones(k)
            tot = float(w.sum())
            kept = float(sum(w[j] for j in range(k) if int(orig[t, j]) in ran))
            st.mass_kept_sum += kept / tot if tot > 0 else 1.0
            st.token_layers += 1

    # ------------------------------------------------------------------------------------------
    def run(self) -> RunStats:
        """Run the whole workload; returns the raw counters (also in ``self.stats``)."""
        self.freq = self._frequencies()
        self.ctx.expert_frequency = self.freq
        self.policy.setup(self.ctx)
        self._apply_fractions()
        need = max(self.part_bytes(layer, p) for layer in range(self.L) for p in range(len(self.fractions[layer])))
        if min(self.capacity) + self.buffer_capacity < need:
            per = min(self.capacity) / self.expert_bytes
            raise MoesimError(
                f"the expert budget holds {per:.2f} experts per {'pool' if self.global_pool else 'layer'}; "
                "at least one expert is needed (raise cache.rate or cache.buffer_experts)")
        self._initial_fill()
        gpu = self.env.process(self._gpu())
        try:
            self.env.run(until=gpu)
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            it, layer = self.cur_iter.index, self.cur_layer
            raise MoesimError(f"the simulation stalled at iteration {it}, layer {layer}: the GPU waits "
                              f"for an event that nothing will trigger (policy {self.policy.name!r})") from None
        return self.stats

    def _frequencies(self) -> np.ndarray:
        """[L, E] access counts over the replayed workload: an offline profile, as the
        ``popular`` warm start and ``static`` policy assume one exists."""
        L, E = self.L, self.E
        freq = np.zeros((L, E), dtype=np.int64)
        rows0 = np.concatenate([it.rows0 for it in self.workload.iterations])
        for layer in range(L):
            ex = self.trace.experts[rows0 + layer].reshape(-1)
            freq[layer] = np.bincount(ex.astype(np.int64), minlength=E)
        return freq
