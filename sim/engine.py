"""The event loop: iterations x MoE layers on one GPU stream, with copy lanes, the VRAM budget,
an optional CPU for experts and the policy's hooks called in contract order.

The hook order and semantics are stated once, in :mod:`moesim.policies.base`; this module
implements them. Its parts live beside it: :mod:`~moesim.sim.vram` (byte accounting),
:mod:`~moesim.sim.lanes` (H2D and D2H copy lanes), :mod:`~moesim.sim.view` (the causal view),
:mod:`~moesim.sim.records` (counters, step records, timeline).

Per layer: the policy's ``before_layer``; the non-MoE compute (plus the runtime's overhead);
routing known, ``on_routed`` returns the plan; each planned expert part is resident (hit),
issued (late) or absent (a demand load, ahead of queued prefetches under priority order);
``on_access`` and ``after_layer`` run while the loads are under way; expert parts compute as
they become resident (ready ones first) on the GPU, CPU slots on the CPU; ``on_layer_end``.
A demand load that finds no room waits (a stall), after the engine has withdrawn queued
prefetches of that pool. With ``swap_out`` an evicted unit drains to the host over the D2H
lane before its room frees; a prefetch whose room still drains waits for it (``WAITING``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from moesim.policies.base import (
    ABSENT,
    HIT,
    INFLIGHT,
    LATE,
    MISS,
    OPTIONAL_COLUMNS,
    PARTIAL,
    QUEUED,
    RESIDENT,
    WAITING,
    Context,
    Decline,
    EvictionRequest,
    Outcome,
    Plan,
    Policy,
    PolicySetupError,
    Profile,
    Reason,
    Routing,
    UnitKey,
)
from moesim.sim.cost import CostModel
from moesim.sim.errors import MoesimError
from moesim.sim.lanes import DEMAND_CLASS, PREFETCH_CLASS, CopyLanes
from moesim.sim.records import RunStats, StepRecords, TimelineEvent
from moesim.sim.view import EngineView
from moesim.sim.vram import Unit, Vram
from moesim.sim.workload import Iteration, Workload

SWAP_QUEUED, SWAPPING = 5, 6   # an evicted unit being copied back to the host (not in vram.units)


class PolicyError(MoesimError, ValueError):
    """A policy broke the contract (an invalid plan or victim) or cannot run on this input."""


class BudgetError(MoesimError, ValueError):
    """The expert budget cannot hold what the run needs (less than one expert per pool, or a
    pool that can evict nothing while a demand load waits)."""


class Engine:
    """Replays a :class:`~moesim.sim.workload.Workload` under a policy. Build, then :meth:`run`."""

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
        pcie_order: str = "priority",
        sync_prefetch: bool = False,
        seed: int = 0,
        profile: Profile | None = None,
        record_steps: bool = True,
        record_timeline: bool = False,
        check_invariants: bool = False,
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
        self.timeline: list[TimelineEvent] = []
        self.steps = StepRecords()
        self.record_steps = record_steps
        self.check_invariants = check_invariants
        self.progress = progress
        self.initial = initial
        self.sync_prefetch = sync_prefetch
        self.warnings: list[str] = []
        pol_seed, eng_seed = np.random.SeedSequence(seed).spawn(2)
        self.rng = np.random.default_rng(eng_seed)

        if policy.scope not in ("layer", "global"):
            raise PolicyError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        self.global_pool = policy.scope == "global"
        caps = [int(budget_bytes)] if self.global_pool else [int(budget_bytes) // self.L] * self.L
        self.vram = Vram(caps, buffer_bytes)
        self.fractions: list[tuple[float, ...]] = [(1.0,)] * self.L
        self.waiting: list[Unit] = []                         # demand units waiting for room, in order
        self.waiting_prefetch: list[tuple[Unit, float]] = []   # prefetches waiting for draining room
        self.lanes = CopyLanes(self.env, cost.hardware.copy_engines, cost.transfer_s,
                               self._on_transfer_start, self._on_transfer_land,
                               queued=QUEUED, inflight=INFLIGHT, order=pcie_order)  # type: ignore[arg-type]
        self.d2h = (CopyLanes(self.env, 1, cost.d2h_transfer_s, lambda u, c, lane: None,
                              self._on_swap_land, queued=SWAP_QUEUED, inflight=SWAPPING, order="fifo")
                    if swap_out else None)
        self.space_event = self.env.event()
        self.last_evict_iter: dict[UnitKey, int] = {}
        self.stats = RunStats()
        self.spent_s = 0.0            # policy CPU time not yet charged on the GPU stream
        self.cpu_free_at = 0.0        # when the CPU finishes the experts queued on it
        self._layer_evictions = 0
        self._layer_prefetch_bytes = 0
        self.cur_layer = -1
        self.routed_upto = -1
        self.cur_iter = workload.iterations[0]
        self.prev_iter: Iteration | None = None
        self.emb_index = (
            {int(r): i for i, r in enumerate(tr.embedding_rows)} if tr.embedding_rows is not None else None
        )
        self._has_on_loaded = type(policy).on_loaded is not Policy.on_loaded
        columns = frozenset(c for c in OPTIONAL_COLUMNS if getattr(tr, c, None) is not None)
        self.ctx = Context(
            model=cost.model, hardware=cost.hardware, cost=cost, num_layers=self.L,
            num_experts=self.E, top_k=self.K, expert_bytes=self.expert_bytes,
            pool_capacity=list(caps), buffer_bytes=self.vram.buffer_capacity,
            total_budget=sum(caps), rng=np.random.default_rng(pol_seed), columns=columns,
            profile=profile, future=workload.future() if policy.oracle else None,
            swap_out=swap_out,
        )

    # ------------------------------------------------------------------------------------------
    # helpers
    def pool_of(self, layer: int) -> int:
        """The pool of ``layer``'s units."""
        return 0 if self.global_pool else layer

    def part_bytes(self, layer: int, part: int) -> int:
        """Bytes of part ``part`` of an expert of ``layer``."""
        fr = self.fractions[layer]
        if not 0 <= part < len(fr):
            raise ValueError(f"layer {layer} has {len(fr)} part(s); no part {part}")
        return int(round(fr[part] * self.expert_bytes))

    @staticmethod
    def rows_of(it: Iteration, layer: int) -> slice | np.ndarray:
        """Trace rows of ``layer`` for the tokens of ``it`` (a slice for one token: numpy views
        are much cheaper than fancy indexing on the hot path)."""
        if it.rows0.shape[0] == 1:
            r = int(it.rows0[0]) + layer
            return slice(r, r + 1)
        return it.rows0 + layer

    def routing_of(self, it: Iteration, layer: int) -> Routing:
        """The recorded routing of ``layer`` for ``it``."""
        rows = self.rows_of(it, layer)
        w = self.trace.weights
        return Routing(layer, self.trace.experts[rows], None if w is None else w[rows])

    def _landing(self, u: Unit) -> simpy.Event:
        """The event that fires when ``u``'s transfer lands (made on first demand)."""
        if u.event is None:
            u.event = self.env.event()
        return u.event

    def _wake(self) -> None:
        if not self.space_event.triggered:
            self.space_event.succeed()

    # ------------------------------------------------------------------------------------------
    # room and eviction
    def _drop(self, u: Unit) -> None:
        """``u`` leaves VRAM: free its room (at once, or when its swap-out lands), account a
        prefetch never used, remember when (refetch accounting), tell the policy."""
        vram = self.vram
        vram.remove(u)
        if self.d2h is None:
            vram.release(u)
            self._wake()
        else:
            vram.start_drain(u)
            u.event = None
            self.d2h.submit(u, DEMAND_CLASS)
        if not u.used and not u.demand:
            self.stats.wasted_prefetch_bytes += u.nbytes
        self.last_evict_iter[u.key] = self.cur_iter.index
        self.policy.on_evict(self.view, u.key)

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        u = self.vram.units.get(key)
        if u is None or u.state != RESIDENT or key in self.vram.pinned:
            return False
        self.stats.evictions += 1
        self._layer_evictions += 1
        self._drop(u)
        return True

    def _make_room(self, pool: int, nbytes: int, reason: Reason, key: UnitKey) -> tuple[bool, int]:
        """Evict policy-chosen victims until ``nbytes`` fit in ``pool``, counting room still
        draining to the host as coming; returns (fits now, evictions)."""
        n = 0
        vram = self.vram
        policy, view = self.policy, self.view
        while vram.room_to_come(pool) < nbytes:
            cands = vram.candidates(pool)
            if not cands:
                break
            req = EvictionRequest(reason, key, pool, nbytes - vram.free(pool), cands)
            victim = policy.choose_victim(view, req)
            if isinstance(victim, Decline):
                if victim is not req.decline:
                    raise PolicyError(f"policy {policy.name!r} answered {victim.value!r} to a "
                                      f"{reason.value} eviction request; expected a victim or "
                                      f"{req.decline.value!r}")
                break
            if not self.evict_key(victim):
                raise PolicyError(f"policy {policy.name!r} chose victim {victim}, which is not an unpinned resident")
            n += 1
        return vram.free(pool) >= nbytes, n

    def _allocate(self, u: Unit, allow_buffer: bool, reason: Reason) -> tuple[bool, int]:
        """Evict for ``u`` as needed, then give it room; returns (got room, evictions)."""
        n = self._make_room(u.pool, u.nbytes, reason, u.key)[1]
        return self.vram.take_room(u, allow_buffer), n

    # ------------------------------------------------------------------------------------------
    # transfers
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

    def _on_transfer_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        u.state = RESIDENT
        self.stats.pcie_busy_s += dur
        if self.record_timeline:
            self.timeline.append((f"PCIe H2D {lane}", self._label(u.key), start, dur,
                                  {"demand": cls == DEMAND_CLASS, "bytes": u.nbytes}))
        if self._has_on_loaded:
            self.policy.on_loaded(self.view, u.key, cls == DEMAND_CLASS)
        if self.waiting:
            self._wake()   # the landed unit may now be evicted for a waiting demand load

    def _on_swap_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        """An evicted unit's copy-back landed on the host: its room is free now."""
        self.vram.end_drain(u)
        u.state = ABSENT
        st = self.stats
        st.d2h_bytes += u.nbytes
        st.d2h_busy_s += dur
        if self.record_timeline:
            self.timeline.append(("PCIe D2H", self._label(u.key), start, dur, {"bytes": u.nbytes}))
        self._wake()
        if self.waiting_prefetch:
            self._grant_prefetches()

    def _grant_prefetches(self) -> None:
        """Queue the prefetches that waited for draining room, in order, where room is free
        now; demand loads waiting for the same pool come first."""
        left: list[tuple[Unit, float]] = []
        demand_pools = {w.pool for w in self.waiting}
        for u, prio in self.waiting_prefetch:
            if u.pool in demand_pools or not self.vram.take_room(u, allow_buffer=True):
                left.append((u, prio))
                continue
            self.vram.unclaim(u)
            self.lanes.submit(u, PREFETCH_CLASS, prio)
        self.waiting_prefetch = left

    def issue_prefetch(self, key: UnitKey, priority: float, into_buffer: bool) -> bool:
        """A policy's prefetch (see :meth:`EngineView.prefetch`)."""
        vram = self.vram
        if key in vram.units:
            return False
        layer, expert, part = key
        if not (0 <= layer < self.L and 0 <= expert < self.E):
            raise PolicyError(f"policy {self.policy.name!r} prefetched expert {expert} of layer "
                              f"{layer}; the model has {self.L} layers x {self.E} experts")
        nbytes = self.part_bytes(layer, part)
        pool = self.pool_of(layer)
        if self.waiting and any(w.pool == pool for w in self.waiting):
            return False  # demand loads waiting for room in this pool come first
        u = Unit(key, nbytes, pool, False)
        if into_buffer:
            if not vram.take_buffer(u):
                return False
        else:
            ok, _ = self._allocate(u, True, Reason.PREFETCH)
            if not ok:
                if vram.room_to_come(pool) < nbytes:
                    return False
                # its room is being copied back to the host (swap_out): claim it and wait
                vram.claim(u)
                vram.add(u)
                self.waiting_prefetch.append((u, priority))
                return True
        vram.add(u)
        self.lanes.submit(u, PREFETCH_CLASS, priority)
        return True

    def reprioritize(self, key: UnitKey, priority: float) -> bool:
        """A policy changes a queued prefetch's priority."""
        u = self.vram.units.get(key)
        if u is None or u.demand:
            return False
        if u.state == WAITING:
            if not self.lanes.can_withdraw:
                return False
            self.waiting_prefetch = [(w, priority if w is u else p) for w, p in self.waiting_prefetch]
            return True
        return self.lanes.reprioritize(u, priority)

    def _drop_queued(self, keep: Callable[[Unit], bool]) -> int:
        """Withdraw queued prefetches for which ``keep`` is False; never a demand load, never a
        pinned unit (none under fifo order)."""
        if not self.lanes.can_withdraw:
            return 0
        vram = self.vram
        pinned = vram.pinned
        dropped = self.lanes.cancel(lambda u, cls: cls != PREFETCH_CLASS or u.key in pinned or keep(u))
        for u in dropped:
            u.state = ABSENT
            vram.remove(u)
            vram.release(u)
        if dropped:
            self._wake()
        if self.waiting_prefetch:   # they hold no room yet, only a claim
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
        """Forget a prefetch waiting for draining room (the caller takes it off the list)."""
        u.state = ABSENT
        self.vram.remove(u)
        self.vram.unclaim(u)

    def _demand_instead(self, u: Unit) -> None:
        """A prefetch still waiting for draining room when its layer is routed: withdraw it;
        the caller loads the unit on demand."""
        self.waiting_prefetch = [x for x in self.waiting_prefetch if x[0] is not u]
        self._withdraw(u)
        self.policy.on_cancel(self.view, u.key)

    def cancel_queued(self, layer: int | None) -> int:
        """Withdraw queued prefetches of ``layer`` (all layers if None)."""
        return self._drop_queued(lambda u: layer is not None and u.key[0] != layer)

    def cancel_queued_pool(self, pool: int) -> int:
        """Withdraw queued prefetches holding room in ``pool`` (not in the buffer), so that a
        waiting demand load can take it."""
        return self._drop_queued(lambda u: u.pool != pool or u.in_buffer)

    def _try_waiting(self) -> tuple[list[Unit], float]:
        """Give room to waiting demand units, in order. Returns the units that got room (to be
        queued once the eviction delay on the critical path, also returned, has passed)."""
        delay = 0.0
        evict_s = self.cost.hardware.evict_us * 1e-6
        granted: list[Unit] = []
        while self.waiting:
            u = self.waiting[0]
            ok, n = self._allocate(u, True, Reason.DEMAND)
            if not ok and self.cancel_queued_pool(u.pool):
                ok, n2 = self._allocate(u, True, Reason.DEMAND)
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
            self.lanes.submit(u, DEMAND_CLASS, 0.0)
        return delay

    # ------------------------------------------------------------------------------------------
    # budgets and splits (policy actions at idle points)
    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the expert budget among layers (see :meth:`EngineView.set_layer_budgets`)."""
        if self.global_pool:
            raise PolicyError(f"policy {self.policy.name!r} has one global pool; it cannot set per-layer budgets")
        if len(budgets) != self.L:
            raise PolicyError(f"need {self.L} layer budgets, got {len(budgets)}")
        total = sum(self.ctx.pool_capacity)
        if sum(int(b) for b in budgets) > total:
            raise PolicyError(f"layer budgets sum to {sum(budgets)} bytes, over the total {total}")
        for layer, b in enumerate(budgets):
            if self.vram.used[layer] > int(b):
                raise PolicyError(f"layer {layer} uses {self.vram.used[layer]} bytes, over its new budget {int(b)}: evict first")
        self.vram.set_capacities([int(b) for b in budgets])

    def set_fractions(self, layer: int, fractions: tuple[float, ...]) -> None:
        """Change how the experts of ``layer`` split into parts (no unit of it may be present)."""
        if abs(sum(fractions) - 1.0) > 1e-9 or any(f < 0 for f in fractions):
            raise PolicyError(f"part fractions of layer {layer} must be >= 0 and sum to 1, got {fractions}")
        if fractions != self.fractions[layer] and any(k[0] == layer for k in self.vram.units):
            raise PolicyError(f"layer {layer} changes its split while units are present: evict them first")
        self.fractions[layer] = fractions

    def _apply_fractions(self) -> None:
        for layer in range(self.L):
            fr = tuple(float(f) for f in self.policy.part_fractions(layer))
            if fr != self.fractions[layer]:
                self.set_fractions(layer, fr)

    # ------------------------------------------------------------------------------------------
    # plans
    def _check_plan(self, plan: Plan, routing: Routing, layer: int) -> np.ndarray:
        """Validate a policy's plan; returns its experts as an int matrix."""
        name = self.policy.name
        where = f"iteration {self.cur_iter.index}, layer {layer}"
        ex = np.asarray(plan.experts)
        if ex.shape[0] != routing.n_tokens:
            raise PolicyError(f"policy {name!r} planned {ex.shape[0]} tokens at {where}; the iteration has {routing.n_tokens}")
        if ex.size and (ex.min() < -1 or ex.max() >= self.E):
            raise PolicyError(f"policy {name!r} planned an expert outside -1..{self.E - 1} at {where}")
        for row in ex:
            valid = row[row >= 0]
            if len(np.unique(valid)) != len(valid):
                raise PolicyError(f"policy {name!r} planned one expert twice for a token at {where}: {row.tolist()}")
        if not self.policy.lossy and not np.array_equal(ex, routing.experts):
            raise PolicyError(f"policy {name!r} is not lossy but planned other experts than the routing at {where}")
        return ex

    def _lossy_stats(self, routing: Routing, plan: np.ndarray | None) -> None:
        """Substitutions, drops, routing mass kept, top-1 agreement and slots run, per token."""
        st = self.stats
        orig = routing.experts
        n, k = orig.shape
        st.token_layers += n
        if plan is None:
            st.mass_kept_sum += n
            st.top1_kept += n
            st.slots_run += n * k
            return
        w = routing.weights
        for t in range(n):
            routed = orig[t].tolist()
            ran = [x for x in plan[t].tolist() if x >= 0]
            ran_set = set(ran)
            subs = sum(1 for x in ran if x not in routed)
            missing = sum(1 for x in routed if x not in ran_set)
            st.substitutions += subs
            st.dropped += max(0, missing - subs)
            st.slots_run += len(ran)
            st.top1_kept += routed[0] in ran_set
            wt = w[t] if w is not None else np.ones(k)
            tot = float(wt.sum())
            kept = float(sum(wt[j] for j in range(k) if routed[j] in ran_set))
            st.mass_kept_sum += kept / tot if tot > 0 else 1.0
            st.lossy_layers += bool(subs or missing)

    # ------------------------------------------------------------------------------------------
    # processes
    def _charge(self) -> Any:
        """Process fragment: the GPU stream waits for policy CPU time spent since the last charge."""
        dt = self.spent_s
        if dt > 0:
            self.spent_s = 0.0
            t0 = self.env.now
            yield self.env.timeout(dt)
            self.stats.policy_cpu_s += dt
            if self.record_timeline:
                self.timeline.append(("CPU policy", "decision", t0, dt, {}))

    def _wait_prefetches(self) -> Any:
        """Process fragment (``sync_prefetch``): the GPU waits for every prefetch issued so far."""
        pending = [self._landing(u) for u in self.vram.units.values()
                   if not u.demand and u.state in (WAITING, QUEUED, INFLIGHT)]
        if pending:
            t0 = self.env.now
            yield self.env.all_of(pending)
            dt = self.env.now - t0
            self.stats.stall_s += dt
            self.stats.sync_stall_s += dt

    def _initial_fill(self) -> list[UnitKey]:
        if self.initial == "empty":
            return []
        L, E = self.L, self.E
        vram = self.vram
        placed: list[UnitKey] = []
        freq = self.ctx.offline_frequency() if self.initial == "popular" else None
        for layer in range(L):
            if freq is not None:
                order = np.argsort(-freq[layer], kind="stable")
            elif self.initial == "random":
                order = self.rng.permutation(E)
            else:
                raise MoesimError(f"cache.initial: unknown value {self.initial!r} (empty, popular or random)")
            pool = self.pool_of(layer)
            share = vram.capacity[pool] if not self.global_pool else vram.capacity[0] // L * (layer + 1)
            for e in order:
                for p in range(len(self.fractions[layer])):
                    key = (layer, int(e), p)
                    nbytes = self.part_bytes(layer, p)
                    if vram.used[pool] + nbytes > min(vram.capacity[pool], share):
                        break
                    u = Unit(key, nbytes, pool, True)
                    u.state = RESIDENT
                    u.used = True
                    vram.take_room(u, allow_buffer=False)
                    vram.add(u)
                    placed.append(key)
        return placed

    def _gpu(self) -> Any:
        env = self.env
        cost = self.cost
        L = self.L
        st = self.stats
        policy = self.policy
        view = self.view
        vram = self.vram
        units = vram.units
        pinned = vram.pinned
        timeline = self.timeline if self.record_timeline else None
        steps = self.steps if self.record_steps else None
        iters = self.workload.iterations
        n_iters = len(iters)
        batch_start: dict[int, float] = {}
        exp_cost: dict[int, float] = {}
        cpu_cost: dict[int, float] = {}
        # skip calls of hooks a policy does not override (the hot path runs per layer)
        cls = type(policy)
        has_before = cls.before_layer is not Policy.before_layer
        has_routed = cls.on_routed is not Policy.on_routed
        has_access = cls.on_access is not Policy.on_access
        has_after = cls.after_layer is not Policy.after_layer
        has_end = cls.on_layer_end is not Policy.on_layer_end
        lossy = policy.lossy
        decision_s = float(policy.decision_us) * 1e-6
        overhead_layer = cost.overhead_layer_s()
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
            if self.spent_s:
                yield from self._charge()
            n_tok = it.n_tokens
            layer_s = cost.layer_s(n_tok)
            for layer in range(L):
                self.cur_layer = layer
                self._layer_evictions = 0
                self._layer_prefetch_bytes = 0
                if self.sync_prefetch:
                    yield from self._wait_prefetches()
                t0 = env.now
                if has_before:
                    policy.before_layer(view, layer)
                    if self.spent_s:
                        yield from self._charge()
                # non-MoE compute, and the runtime's per-layer overhead
                yield timeout(layer_s + overhead_layer)
                st.gpu_busy_s += layer_s
                st.overhead_s += overhead_layer
                if timeline is not None:
                    timeline.append(("GPU", f"L{layer} attn", env.now - layer_s - overhead_layer,
                                     layer_s + overhead_layer, {"iteration": it.index}))
                # routing known: the plan
                self.routed_upto = layer
                routing = self.routing_of(it, layer)
                plan = policy.on_routed(view, layer, routing) if has_routed else None
                on_cpu = None
                if plan is None:
                    plan_m = routing.experts
                    if lossy:
                        self._lossy_stats(routing, None)
                else:
                    plan_m = self._check_plan(plan, routing, layer)
                    on_cpu = None if plan.on_cpu is None else np.asarray(plan.on_cpu, dtype=bool)
                    if lossy:
                        self._lossy_stats(routing, plan_m)
                if decision_s:
                    self.spent_s += decision_s
                if self.spent_s:
                    yield from self._charge()
                t_route = env.now
                # experts that run on the GPU (access order) and on the CPU, with token counts
                cpu_exps: list[int] = []
                cpu_counts: list[int] = []
                if on_cpu is not None and on_cpu.any():
                    gmask = (plan_m >= 0) & ~on_cpu
                    cmask = (plan_m >= 0) & on_cpu
                    cpu_exps, cpu_counts = _access_order(plan_m[cmask])
                    exps, counts = _access_order(plan_m[gmask])
                elif n_tok == 1:
                    exps = [x for x in plan_m.reshape(-1).tolist() if x >= 0]
                    counts = [1] * len(exps)
                else:
                    flat = plan_m.reshape(-1)
                    exps, counts = _access_order(flat[flat >= 0])
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
                            vram.add(u)
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
                # CPU experts start now, one after another on the host
                cpu_done = 0.0
                if cpu_exps:
                    start = max(env.now, self.cpu_free_at)
                    tc = start
                    for e, c in zip(cpu_exps, cpu_counts, strict=True):
                        dt = cpu_cost.get(c)
                        if dt is None:
                            dt = cpu_cost[c] = cost.cpu_expert_s(c)
                        if timeline is not None:
                            timeline.append(("CPU experts", f"L{layer} E{e}", tc, dt, {"tokens": c}))
                        tc += dt
                    st.cpu_busy_s += tc - start
                    st.cpu_accesses += len(cpu_exps)
                    self.cpu_free_at = cpu_done = tc
                # demand loads for absent parts, ahead of queued prefetches
                stall = 0.0
                if miss_units:
                    self.waiting.extend(miss_units)
                if self.waiting:
                    stall += yield from self._issue_demand()
                if has_access or has_after:
                    outcome = Outcome(layer, routing, plan_m, exps, status, cpu_exps)
                    if has_access:
                        policy.on_access(view, layer, outcome)
                    if has_after:
                        policy.after_layer(view, layer, outcome)
                    if self.spent_s:
                        yield from self._charge()
                # GPU experts compute as their parts become resident, ready ones first
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
                if cpu_done > env.now:   # the layer also waits for its CPU experts
                    wait = cpu_done - env.now
                    yield timeout(wait)
                    st.cpu_wait_s += wait
                pinned.clear()
                st.stall_s += stall
                if vram.buffer_used:
                    self._settle_buffer(layer)
                if has_end:
                    policy.on_layer_end(view, layer)
                if self.check_invariants:
                    vram.check()
                if steps is not None:
                    steps.append((it.index, layer, t0, t_route, env.now, len(exps), hits, late, part,
                                  miss, len(cpu_exps), stall, miss_bytes, self._layer_prefetch_bytes,
                                  self._layer_evictions))
            head = cost.head_s(n_tok)
            over = cost.overhead_iteration_s(n_tok)
            if head + over > 0:
                yield timeout(head + over)
                st.gpu_busy_s += head
                st.overhead_s += over
            now = env.now
            st.iteration_end.append(now)
            for r in dict.fromkeys(it.request_ids.tolist()):   # one output token per request
                st.token_end.setdefault(int(r), []).append(now)
            self.cur_layer = L
            policy.on_iteration_end(view)
            if self.spent_s:
                yield from self._charge()
            self._apply_fractions()
            self.prev_iter = it
            if self.progress is not None:
                self.progress(it.index + 1, n_iters)

    def _check_deadlock(self, layer: int) -> None:
        busy = (any(u.state in (QUEUED, INFLIGHT) for u in self.vram.units.values())
                or self.vram.draining_any())
        if not busy:
            u = self.waiting[0]
            raise BudgetError(
                f"the expert budget is too small: layer {layer} needs {u.nbytes} bytes for expert "
                f"{u.key[1]} but its pool holds {self.vram.capacity[u.pool]} bytes and policy "
                f"{self.policy.name!r} can evict none of them (pinned or refused); raise "
                "cache.rate or cache.buffer_experts")

    def _settle(self, u: Unit) -> None:
        """A resident unit in the transfer buffer whose layer is done with it: it moves into its
        pool if the policy admits it and room can be made, else it is dropped."""
        if self.policy.admit(self.view, u.key) and self._make_room(u.pool, u.nbytes, Reason.ADMIT, u.key)[0]:
            self.vram.move_to_pool(u)
        else:
            self._drop(u)

    def _settle_buffer(self, layer: int) -> None:
        """After ``layer`` computed, settle its resident units still in the transfer buffer."""
        for key, u in list(self.vram.units.items()):
            if u.in_buffer and u.state == RESIDENT and key[0] == layer:
                self._settle(u)

    # ------------------------------------------------------------------------------------------
    def run(self) -> RunStats:
        """Run the whole workload; returns the raw counters (also in ``self.stats``)."""
        policy = self.policy
        missing = sorted(policy.required_columns() - self.ctx.columns)
        if missing:
            raise PolicySetupError(f"policy {policy.name!r} needs trace column(s) {', '.join(missing)}, "
                                   f"which the trace ({self.trace.model.name}) lacks")
        self.ctx.replayed_frequency = self._frequencies()
        policy.setup(self.ctx)
        self._apply_fractions()
        need = max(self.part_bytes(layer, p) for layer in range(self.L) for p in range(len(self.fractions[layer])))
        if min(self.vram.capacity) + self.vram.buffer_capacity < need:
            per = min(self.vram.capacity) / self.expert_bytes
            raise BudgetError(
                f"the expert budget holds {per:.2f} experts per {'pool' if self.global_pool else 'layer'}; "
                "at least one expert is needed (raise cache.rate or cache.buffer_experts)")
        placed = self._initial_fill()
        self.stats.vram_peak_bytes = self.vram.peak
        policy.warm(self.view, placed)
        gpu = self.env.process(self._gpu())
        try:
            self.env.run(until=gpu)
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            it, layer = self.cur_iter.index, self.cur_layer
            raise PolicyError(f"the simulation stalled at iteration {it}, layer {layer}: the GPU waits "
                              f"for an event that nothing will trigger (policy {policy.name!r})") from None
        self.stats.vram_peak_bytes = self.vram.peak
        self.warnings.extend(self.ctx.warnings)
        if self.ctx.frequency_reads and self.ctx.profile is None:
            self.warnings.append(
                "offline expert popularity was taken from the replayed requests themselves (no "
                "profile: split given), an optimistic profile; give a profile: split for a fair one")
        return self.stats

    def _frequencies(self) -> np.ndarray:
        """[L, E] access counts over the replayed workload."""
        L, E = self.L, self.E
        freq = np.zeros((L, E), dtype=np.int64)
        rows0 = np.concatenate([it.rows0 for it in self.workload.iterations])
        for layer in range(L):
            ex = self.trace.experts[rows0 + layer].reshape(-1)
            freq[layer] = np.bincount(ex.astype(np.int64), minlength=E)
        return freq


def _access_order(valid: np.ndarray) -> tuple[list[int], list[int]]:
    """Distinct experts of ``valid`` (flattened, tokens in order) by first occurrence, and how
    many tokens each serves."""
    uniq, first, cnt = np.unique(valid, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return [int(x) for x in uniq[order]], [int(x) for x in cnt[order]]
