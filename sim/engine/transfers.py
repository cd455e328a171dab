"""Room, eviction and transfers: how units get VRAM, leave it, and travel over the copy lanes.

:class:`Transfers` owns the waiting lists and both copy lanes of a run and asks the policy for
victims (:class:`~moesim.policies.contract.base.EvictionRequest`). Demand loads that find no room wait in
order; a prefetch whose room is still draining to the host (``swap_out``) claims it and waits;
queued prefetches can be withdrawn, and a policy may abort one in flight (neither under fifo
order: :mod:`moesim.sim.engine.withdrawals`). Every byte is booked in
:class:`~moesim.sim.engine.vram.Vram`, which keeps the budget's invariant. Two paths that run
for every copy or eviction (a prefetch's room and a drop) write Vram's books inline,
as its ``take_room``, ``add`` and ``release`` would (about 6% of a streaming baseline's run);
each says so where it does, and ``vram.check()`` verifies the books on runs with
``check_invariants`` (every run of the tests' ``run_engine`` helper).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import simpy
from simpy.events import PENDING

from moesim.policies.contract.base import (
    ABSENT,
    INFLIGHT,
    QUEUED,
    RESIDENT,
    Decline,
    EvictionRequest,
    Reason,
    UnitKey,
)
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.frozen import slot_maker
from moesim.sim.engine.lanes import DEMAND_CLASS, PREFETCH_CLASS, CopyLanes
from moesim.sim.engine.vram import Unit
from moesim.sim.engine.withdrawals import Withdrawals

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState

SWAP_QUEUED, SWAPPING = 5, 6   # an evicted unit being copied back to the host (not in vram.units)

LanesT = TypeVar("LanesT", bound=CopyLanes)
"""The class of a run's copy lanes (:meth:`Transfers.new_lanes`)."""

new_request = slot_maker(EvictionRequest)   # EvictionRequest(...) at a third of the cost


class PolicyError(MoesimError, ValueError):
    """A policy broke the contract (an invalid plan or victim) or cannot run on this input."""


class BudgetError(MoesimError, ValueError):
    """The expert budget cannot hold what the run needs (less than one expert per pool, or a
    pool that can evict nothing while a demand load waits)."""


class Transfers(Withdrawals):
    """The run's room and copy traffic (see the module docstring), on the run's state: its
    VRAM, policy and view, counters, timeline and part fractions (a list updated in place)."""

    def __init__(self, state: RunState[Transfers], env: simpy.Environment, *, swap_out: bool,
                 pcie_order: str, serial_swap: bool = False) -> None:
        cost = state.cost
        self.state = state
        self.env, self.vram, self.policy, self.view, self.cost = env, state.vram, state.policy, state.view, cost
        self.stats, self.timeline, self.record_timeline = state.stats, state.timeline, state.record_timeline
        self.L, self.E = state.L, state.E
        self.global_pool = state.global_pool
        self.fractions = state.fractions
        self.expert_bytes = state.expert_bytes
        self.waiting: list[Unit] = []                         # demand units waiting for room, in order
        self.waiting_prefetch: list[tuple[Unit, float]] = []   # prefetches waiting for draining room
        self.lanes, self.d2h = self.new_lanes(CopyLanes, env, pcie_order, swap_out)  # type: ignore[arg-type]
        self.space_event = env.event()
        # cache.serial_swap: demand loads queued or in flight; while there is one, no eviction
        # for the next waiting demand load starts (evict-then-fetch, one miss at a time)
        self.serial_swap = serial_swap and swap_out
        self.demand_pending = 0
        self.last_evict_iter: dict[UnitKey, int] = {}
        self.iteration = 0            # index of the iteration being replayed (refetch accounting)
        self.layer_evictions = 0      # counters of the layer being replayed, for its step record
        self.layer_prefetch_bytes = 0
        self._has_on_loaded = state.policy.uses_hook("on_loaded")
        # hooks called per eviction, bound once (a policy's methods do not change during a run)
        self._choose_victim, self._on_evict = state.policy.choose_victim, state.policy.on_evict
        self._has_on_evict = state.policy.uses_hook("on_evict")   # else drop skips the no-op call
        self.issue_s = cost.prefetch_issue_s()   # runtime.prefetch_issue_us, per prefetch issued
        self._evict_s = cost.hardware.evict_us * 1e-6   # per eviction a demand load waits for
        self._demand_s = cost.demand_load_s()           # runtime.demand_load_us, per demand load
        self._sizes = state.part_sizes   # part split -> bytes of each part (the state's cache)

    def new_lanes(self, make: type[LanesT], env: Any, order: Literal["priority", "fifo"], swap_out: bool) -> tuple[LanesT, LanesT | None]:
        """The run's copy lanes, built by ``make`` (:class:`CopyLanes`, or a subclass on another
        clock ``env``): the host-to-device lanes in ``order`` and, with ``swap_out``, the one
        device-to-host lane, each keeping these transfers' books."""
        cost = self.cost
        h2d = make(env, int(cost.hardware.copy_engines), cost.transfer_s, self.count_start, self._on_transfer_land,
                   queued=QUEUED, inflight=INFLIGHT, order=order)
        d2h = (make(env, 1, cost.d2h_transfer_s, lambda u, c, lane: None, self._on_swap_land, queued=SWAP_QUEUED,
                    inflight=SWAPPING, order="fifo") if swap_out else None)
        return h2d, d2h

    def landing(self, u: Unit) -> simpy.Event:
        """The event that fires when ``u``'s transfer lands (made on first demand)."""
        if u.event is None:
            u.event = self.env.event()
        ev: simpy.Event = u.event
        return ev

    def wake(self) -> None:
        if self.space_event._value is PENDING:   # not triggered (without the property call)
            self.space_event.succeed()

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the expert budget among layers (see :meth:`EngineView.set_layer_budgets`)."""
        st = self.state
        if self.global_pool:
            raise PolicyError(f"policy {self.policy.name!r} has one global pool; it cannot set per-layer budgets")
        if len(budgets) != self.L:
            raise PolicyError(f"need {self.L} layer budgets, got {len(budgets)}")
        total = sum(st.ctx.pool_capacity)
        if sum(int(b) for b in budgets) > total:
            raise PolicyError(f"layer budgets sum to {sum(budgets)} bytes, over the total {total}")
        vram = self.vram
        for layer, b in enumerate(budgets):   # what drains back to the host leaves as it lands
            held = vram.used[layer] - vram.draining[layer] + vram.claimed[layer] - vram.reserved[layer]
            if held > int(b):
                raise PolicyError(f"layer {layer} uses {held} bytes, over its new budget {int(b)}: evict first")
        vram.set_capacities([int(b) for b in budgets], total)

    # ------------------------------------------------------------------------------------------
    # room and eviction
    def drop(self, u: Unit) -> None:
        """``u`` leaves VRAM: free its room (at once, or when its swap-out lands), account a
        prefetch never used, remember when (refetch accounting), tell the policy."""
        vram = self.vram
        key = u.key
        del vram.units[key]   # vram.remove(u), inlined (once per eviction)
        del vram.pool_units[u.pool][key]
        if vram.tracked:
            del vram.layer_units[key[0]][key]
            if u.state == RESIDENT and not u.in_buffer:   # vram.unlist(u), inlined
                seqs = vram.victim_seqs[u.pool]
                i = bisect_left(seqs, u.seq)
                del seqs[i]
                del vram.victim_keys[u.pool][i]
        if self.d2h is None:
            nbytes = u.nbytes   # vram.release(u), inlined
            if u.in_buffer:
                vram.buffer_used -= nbytes
            else:
                vram.used[u.pool] -= nbytes
            vram.total -= nbytes
            if self.space_event._value is PENDING:   # self.wake()
                self.space_event.succeed()
        else:
            vram.start_drain(u)
            u.event = None
            self.d2h.submit(u, DEMAND_CLASS)
        if not u.used and not u.demand:
            self.stats.wasted_prefetch_bytes += u.nbytes
        self.last_evict_iter[key] = self.iteration
        if self._has_on_evict:
            self._on_evict(self.view, key)

    def settle(self, u: Unit) -> None:
        """A resident unit in the transfer buffer whose layer is done with it: it moves into its
        pool if the policy admits it and room can be made, else it is dropped."""
        if self.policy.admit(self.view, u.key) and self.make_room(u.pool, u.nbytes, Reason.ADMIT, u.key)[0]:
            self.vram.move_to_pool(u)
        else:
            self.drop(u)

    def settle_buffer(self, layer: int) -> None:
        """After ``layer`` computed, settle its resident units still in the transfer buffer."""
        for u in list(self.vram.units_of(layer).values()):
            if u.in_buffer and u.state == RESIDENT:
                self.settle(u)

    def check_deadlock(self, layer: int) -> None:
        """Demand loads wait for room and nothing is under way that could free some: the
        budget is too small for the policy (raises :class:`BudgetError`)."""
        busy = (any(u.state in (QUEUED, INFLIGHT) for u in self.vram.units.values())
                or self.vram.draining_any())
        if not busy:
            u = self.waiting[0]
            raise BudgetError(
                f"the expert budget is too small: layer {layer} needs {u.nbytes} bytes for expert "
                f"{u.key[1]} but its pool holds {self.vram.capacity[u.pool]} bytes and policy "
                f"{self.policy.name!r} can evict none of them (pinned or refused); raise "
                "cache.rate or cache.buffer_experts")

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        vram = self.vram
        u = vram.units.get(key)
        if u is None or u.state != RESIDENT or key in vram.pinned:
            return False
        self.stats.evictions += 1
        self.layer_evictions += 1
        self.drop(u)
        return True

    def make_room(self, pool: int, nbytes: int, reason: Reason, key: UnitKey) -> tuple[bool, int]:
        """Evict policy-chosen victims until ``nbytes`` fit in ``pool``, counting room still
        draining to the host as coming; returns (fits now, evictions)."""
        vram = self.vram
        used, draining, claimed, pinned = vram.used, vram.draining, vram.claimed, vram.pinned
        # room_to_come, free, candidates (for a pool it does not track) and evict_key inlined:
        # this runs for every prefetch and demand load
        n = 0
        tracked = vram.tracked
        while vram.capacity[pool] - used[pool] + draining[pool] - claimed[pool] < nbytes:
            if tracked:   # the global pool: its victims are kept
                if not vram.victim_keys[pool]:
                    break
                cands = vram.candidates(pool)
            else:
                units = vram.pool_units[pool]
                if len(units) <= len(pinned) and pinned.issuperset(units):
                    break   # every unit is pinned (often, while demand loads wait): no candidate, at C speed
                if len(units) > 8:   # a large pool: the comprehension's own frame pays off
                    cands = [k for k, u in units.items() if u.state == RESIDENT and not u.in_buffer and k not in pinned]
                else:
                    cands = []   # a plain loop: a comprehension is a call of its own, and pools are small
                    for k, u in units.items():
                        if u.state == RESIDENT and not u.in_buffer and k not in pinned:
                            cands.append(k)
            if not cands:
                break
            req = new_request(reason, key, pool, nbytes - (vram.capacity[pool] - used[pool]), cands)
            victim = self._choose_victim(self.view, req)
            if isinstance(victim, Decline):
                if victim is not req.decline:
                    raise PolicyError(f"policy {self.policy.name!r} answered {victim.value!r} to a "
                                      f"{reason.value} eviction request; expected a victim or "
                                      f"{req.decline.value!r}")
                break
            gone = vram.units.get(victim)
            if gone is None or gone.state != RESIDENT or victim in pinned:
                raise PolicyError(f"policy {self.policy.name!r} chose victim {victim}, which is not an unpinned resident")
            self.stats.evictions += 1
            self.layer_evictions += 1
            self.drop(gone)
            n += 1
        return vram.capacity[pool] - used[pool] >= nbytes, n

    def _allocate(self, u: Unit, allow_buffer: bool, reason: Reason) -> tuple[bool, int]:
        """Evict for ``u`` as needed, then give it room; returns (got room, evictions)."""
        n = self.make_room(u.pool, u.nbytes, reason, u.key)[1]
        return self.vram.take_room(u, allow_buffer), n

    # ------------------------------------------------------------------------------------------
    # transfers
    def count_start(self, u: Unit, cls: int, lane: int) -> None:
        """A copy of ``u`` (of class ``cls``) starts on ``lane``: count its bytes (demand,
        prefetch, refetch) and the layer's prefetch bytes."""
        st = self.stats
        nbytes = u.nbytes
        refetched = self.last_evict_iter.get(u.key)
        if refetched is not None and self.iteration - refetched <= 1:
            st.refetch_bytes += nbytes
            u.refetched = True
        if cls == DEMAND_CLASS:
            st.demand_bytes += nbytes
        else:
            st.prefetch_bytes += nbytes
            st.prefetch_units += 1
            self.layer_prefetch_bytes += nbytes

    def _label(self, key: UnitKey) -> str:
        """A transfer's name on the timeline: ``L3 E5``, or ``L3 E5.1`` for a segment."""
        return f"L{key[0]} E{key[1]}" + (f".{key[2]}" if len(self.fractions[key[0]]) > 1 else "")

    def _on_transfer_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        u.state = RESIDENT   # vram.landed(u), inlined (once per transfer)
        vram = self.vram
        if vram.tracked and not u.in_buffer:   # a victim of the global pool now: vram.enlist(u), its common case inlined
            seqs = vram.victim_seqs[u.pool]
            seq = u.seq
            if not seqs or seqs[-1] < seq:   # the pool's newest (the common case)
                seqs.append(seq)
                vram.victim_keys[u.pool].append(u.key)
            else:
                vram.enlist(u)
        if cls == DEMAND_CLASS and self.demand_pending:
            self.demand_pending -= 1
        self.stats.pcie_busy_s += dur
        if self.record_timeline:
            self.timeline.append((f"PCIe H2D {lane}", self._label(u.key), start, dur,
                                  {"demand": cls == DEMAND_CLASS, "bytes": u.nbytes}))
        if self._has_on_loaded:
            self.policy.on_loaded(self.view, u.key, cls == DEMAND_CLASS)
        if self.waiting:
            self.wake()   # the landed unit may now be evicted for a waiting demand load

    def _on_swap_land(self, u: Unit, cls: int, lane: int, start: float, dur: float) -> None:
        """An evicted unit's copy-back landed on the host: its room is free now."""
        self.vram.end_drain(u)
        u.state = ABSENT
        st = self.stats
        st.d2h_bytes += u.nbytes
        st.d2h_busy_s += dur
        if self.record_timeline:
            self.timeline.append(("PCIe D2H", self._label(u.key), start, dur, {"bytes": u.nbytes}))
        self.wake()
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
        """A policy's prefetch (see :meth:`EngineView.prefetch`). One that is issued (True)
        costs the host ``runtime.prefetch_issue_us``, left in the state's ``spent_s`` (the GPU
        stream charges it at the next hook boundary); the copy is queued at once."""
        vram = self.vram
        if key in vram.units:
            return False
        layer, expert, part = key
        if not (0 <= layer < self.L and 0 <= expert < self.E):
            raise PolicyError(f"policy {self.policy.name!r} prefetched expert {expert} of layer "
                              f"{layer}; the model has {self.L} layers x {self.E} experts")
        sizes = self._sizes.get(self.fractions[layer])
        nbytes = sizes[part] if sizes is not None and 0 <= part < len(sizes) else self.state.part_bytes(layer, part)
        pool = 0 if self.global_pool else layer
        waiting = self.waiting
        if waiting:   # a plain loop: any() over a generator costs a call and a frame
            for w in waiting:
                if w.pool == pool:
                    return False  # demand loads waiting for room in this pool come first
        # the unit is made once it has room (a prefetch refused for room makes none)
        if into_buffer:
            if vram.buffer_capacity - vram.buffer_used < nbytes:
                return False
            u = Unit(key, nbytes, pool, False)
            vram.take_buffer(u)
        else:
            used = vram.used
            if vram.capacity[pool] - used[pool] + vram.draining[pool] - vram.claimed[pool] < nbytes:
                self.make_room(pool, nbytes, Reason.PREFETCH, key)   # (it evicts nothing when this fits)
            # vram.take_room(u, True), inlined (once per prefetch)
            if vram.capacity[pool] - used[pool] >= nbytes:
                used[pool] += nbytes
                u = Unit(key, nbytes, pool, False)
            elif vram.buffer_capacity - vram.buffer_used >= nbytes:
                vram.buffer_used += nbytes
                u = Unit(key, nbytes, pool, False)
                u.in_buffer = True
            else:
                if self.d2h is None or vram.room_to_come(pool) < nbytes:   # nothing drains without swap_out
                    return False
                u = Unit(key, nbytes, pool, False)
                # its room is being copied back to the host (swap_out): claim it and wait
                vram.claim(u)
                vram.add(u)
                self.waiting_prefetch.append((u, priority))
                if self.issue_s:
                    self._spend_issue()
                return True
            tot = vram.total = vram.total + nbytes
            if tot > vram.peak:
                vram.peak = tot
        if vram.tracked:   # vram.add(u), inlined (once per prefetch; u is not resident)
            u.seq = vram.next_seq
            vram.next_seq += 1
            vram.layer_units[layer][key] = u
        vram.units[key] = u
        vram.pool_units[pool][key] = u
        self.lanes.submit(u, PREFETCH_CLASS, priority)
        issue_s = self.issue_s
        if issue_s:   # self._spend_issue(), inlined
            st = self.state
            st.spent_s += issue_s
            st.issue_spent_s += issue_s
        return True

    def _spend_issue(self) -> None:
        """A prefetch was issued: its host cost waits in the state's ``spent_s`` for the GPU
        stream's next charge."""
        st = self.state
        st.spent_s += self.issue_s
        st.issue_spent_s += self.issue_s

    def issued_units(self, layer: int, experts: tuple[int, ...], running: list[int], nparts: int,
                     policy_name: str) -> list[Unit]:
        """The present units of a plan's ``wait_for`` experts of ``layer`` (what the layer waits
        for); an expert outside the model, or one that a slot runs, breaks the contract."""
        out = []
        units = self.vram.units
        E = self.E
        for e in experts:
            if not 0 <= e < E or e in running:
                raise PolicyError(f"policy {policy_name!r} waits for expert {e} of layer {layer}, which "
                                  + ("a slot of the plan runs" if 0 <= e < E else "the model does not have"))
            if nparts == 1:   # whole experts (most runs): no loop over parts
                u = units.get((layer, e, 0))
                if u is not None:
                    out.append(u)
                continue
            for p in range(nparts):
                u = units.get((layer, e, p))
                if u is not None:
                    out.append(u)
        return out

    def grant_waiting(self) -> tuple[list[Unit], float]:
        """Give room to waiting demand units, in order. Returns the units that got room and the
        delay on the critical path (seconds: ``hardware.evict_us`` per eviction plus
        ``runtime.demand_load_us`` per granted load): the caller waits that long, then queues
        them with :meth:`queue_demand` (the engine's GPU process does this inline, without a
        sub-generator per call)."""
        delay = 0.0
        evict_s = self._evict_s
        demand_s = self._demand_s
        granted: list[Unit] = []
        vram = self.vram
        used, draining, claimed = vram.used, vram.draining, vram.claimed   # never rebound (capacity is)
        waiting = self.waiting
        while waiting:
            u = waiting[0]
            pool, nbytes = u.pool, u.nbytes
            if (self.demand_pending and self.serial_swap and vram.room_to_come(pool) < nbytes
                    and vram.buffer_free() < nbytes):
                break   # its room needs an eviction: not before the previous demand load landed
            # self._allocate(u, True, Reason.DEMAND), inlined: make_room evicts nothing when it fits
            n = (self.make_room(pool, nbytes, Reason.DEMAND, u.key)[1]
                 if vram.capacity[pool] - used[pool] + draining[pool] - claimed[pool] < nbytes else 0)
            ok = vram.take_room(u, True)
            if not ok and self.cancel_queued_pool(pool):
                ok, n2 = self._allocate(u, True, Reason.DEMAND)
                n += n2
            delay += n * evict_s
            if not ok:
                break
            waiting.pop(0)
            u.state = QUEUED
            granted.append(u)
            if self.serial_swap:
                self.demand_pending += 1
            if demand_s:
                delay += demand_s
        return granted, delay

    def queue_demand(self, granted: list[Unit]) -> None:
        """Queue the demand loads :meth:`grant_waiting` gave room, once its delay has passed."""
        submit = self.lanes.submit
        for u in granted:
            submit(u, DEMAND_CLASS, 0.0)
