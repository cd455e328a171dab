"""Where the executor's experts live and how they move: the executor's counterpart of the event
loop's :class:`~moesim.sim.engine.transfers.Transfers` (the run state's ``transfers``, where the
policy's actions go). Room and victims follow the simulator's rules on the simulator's own
VRAM accounting (:class:`~moesim.sim.engine.vram.Vram`); the copies are real, on the copy engine
(:mod:`.copier`) into device slots (:mod:`.store`). Unit states change only on the main thread,
in :meth:`Residency.refresh`, so every policy callback runs there.
"""

from __future__ import annotations

from typing import Any

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
from moesim.sim.engine.state import RunState
from moesim.sim.engine.vram import Unit
from moesim.sim.real.executor.copier import DEMAND, PREFETCH
from moesim.sim.real.executor.stats import ExecStats
from moesim.sim.real.executor.store import ExpertStore


class ExecutorError(MoesimError, ValueError):
    """A run the executor cannot do (batching, swap-out, expert segments) or a policy that broke
    the contract; one line."""


class Residency:
    """The executor's room, evictions and copies for the run ``state`` (see the module
    docstring): ``store`` holds the weights, ``copier`` moves them; ``jobs`` are the copies not
    yet seen landed, ``waiting`` the demand units waiting for room, in order."""

    def __init__(self, state: RunState[Residency], stats: ExecStats, store: ExpertStore, copier: Any) -> None:
        self.state = state
        self.vram, self.policy, self.stats = state.vram, state.policy, stats
        self.store = store
        self.copier = copier
        self.jobs: dict[UnitKey, Any] = {}
        self.waiting: list[Unit] = []

    def refresh(self) -> None:
        """Bring unit states up to date with the copy engine (main thread only)."""
        if not self.jobs:
            return
        st = self.stats
        view = self.state.view
        for key, job in list(self.jobs.items()):
            u = self.vram.units.get(key)
            if u is None:
                del self.jobs[key]
                continue
            if u.state == QUEUED and self.copier.started(job):
                u.state = INFLIGHT
                st.count_start(u)
            if self.copier.done(job):
                if u.state == QUEUED:
                    st.count_start(u)
                self.vram.landed(u)   # resident: one of its pool's victims
                del self.jobs[key]
                self.policy.on_loaded(view, key, u.demand)

    def drop(self, u: Unit) -> None:
        """``u`` leaves the device: free its room and slot, account a prefetch never used, tell
        the policy."""
        self.vram.remove(u)
        self.vram.release(u)
        self.store.free(u.key)
        if not u.used and not u.demand:
            self.stats.wasted_prefetch_bytes += u.nbytes
        self.policy.on_evict(self.state.view, u.key)

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        u = self.vram.units.get(key)
        if u is None or u.state != RESIDENT or key in self.vram.pinned:
            return False
        self.stats.evictions += 1
        self.drop(u)
        return True

    def make_room(self, pool: int, nbytes: int, reason: Reason, key: UnitKey) -> bool:
        """Evict policy-chosen victims until ``nbytes`` fit in ``pool``; whether they fit."""
        vram, policy = self.vram, self.policy
        while vram.free(pool) < nbytes:
            cands = vram.candidates(pool)
            if not cands:
                break
            req = EvictionRequest(reason, key, pool, nbytes - vram.free(pool), cands)
            victim = policy.choose_victim(self.state.view, req)
            if isinstance(victim, Decline):
                if victim is not req.decline:
                    raise ExecutorError(f"policy {policy.name!r} answered {victim.value!r} to a {reason.value} "
                                        f"eviction request; expected a victim or {req.decline.value!r}")
                break
            if not self.evict_key(victim):
                raise ExecutorError(f"policy {policy.name!r} chose victim {victim}, which is not an unpinned resident")
        return vram.free(pool) >= nbytes

    def submit(self, u: Unit, cls: int, priority: float = 0.0) -> None:
        """Queue the copy of ``u`` into a free slot."""
        layer, expert, _ = u.key
        dst = self.store.alloc(u.key)
        u.state = QUEUED
        self.jobs[u.key] = self.copier.submit(u.key, self.store.source(layer, expert), dst, cls, priority,
                                              after=self.store.fence(u.key))

    def issue_prefetch(self, key: UnitKey, priority: float, into_buffer: bool) -> bool:
        """A policy's prefetch: room now (victims from the policy), then a queued copy."""
        vram = self.vram
        if key in vram.units:
            return False
        s = self.state
        layer, expert, part = key
        if not (0 <= layer < s.L and 0 <= expert < s.E) or part != 0:
            raise ExecutorError(f"policy {self.policy.name!r} prefetched {key}; the model has {s.L} layers x "
                                f"{s.E} experts of one part")
        pool = s.pool_of(layer)
        if any(w.pool == pool for w in self.waiting):
            return False
        u = Unit(key, s.expert_bytes, pool, False)
        if into_buffer:
            if not vram.take_buffer(u):
                return False
        else:
            self.make_room(pool, u.nbytes, Reason.PREFETCH, key)
            if not vram.take_room(u, True):
                return False
        vram.add(u)
        self.submit(u, PREFETCH, priority)
        return True

    def reprioritize(self, key: UnitKey, priority: float) -> bool:
        """Change a queued prefetch's priority."""
        job = self.jobs.get(key)
        u = self.vram.units.get(key)
        if job is None or u is None or u.demand:
            return False
        return bool(self.copier.reprioritize(job, priority))

    def cancel_queued(self, layer: int | None, pool: int | None = None) -> int:
        """Withdraw queued prefetches (of ``layer``, or holding room in ``pool``, or all)."""
        dropped = []
        for key, job in list(self.jobs.items()):
            u = self.vram.units.get(key)
            if u is None or u.demand or key in self.vram.pinned or u.state != QUEUED:
                continue
            if layer is not None and key[0] != layer:
                continue
            if pool is not None and (u.pool != pool or u.in_buffer):
                continue
            if self.copier.cancel(job):
                del self.jobs[key]
                u.state = ABSENT
                self.vram.remove(u)
                self.vram.release(u)
                self.store.free(key)
                dropped.append(key)
        for key in dropped:
            self.policy.on_cancel(self.state.view, key)
        return len(dropped)

    def abort_prefetch(self, key: UnitKey) -> bool:
        """Stop a prefetch that has not landed: a queued copy is withdrawn (as
        :meth:`cancel_queued` does); one the copy engine has started cannot be stopped on a
        real device, so it is left to land (False), as are demand loads and pinned units."""
        self.refresh()
        u = self.vram.units.get(key)
        job = self.jobs.get(key)
        if u is None or job is None or u.demand or key in self.vram.pinned or u.state != QUEUED:
            return False
        if not self.copier.cancel(job):
            return False
        del self.jobs[key]
        u.state = ABSENT
        self.vram.remove(u)
        self.vram.release(u)
        self.store.free(key)
        self.policy.on_cancel(self.state.view, key)
        return True

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the budget among layers (bytes per layer), usage fitting."""
        s = self.state
        if s.global_pool or len(budgets) != s.L:
            raise ExecutorError(f"policy {self.policy.name!r}: need {s.L} layer budgets of a per-layer pool")
        if sum(int(b) for b in budgets) > sum(s.ctx.pool_capacity):
            raise ExecutorError(f"layer budgets sum to {sum(budgets)} bytes, over the total")
        for layer, b in enumerate(budgets):
            if self.vram.used[layer] > int(b):
                raise ExecutorError(f"layer {layer} uses {self.vram.used[layer]} bytes, over its new budget {int(b)}")
        self.vram.set_capacities([int(b) for b in budgets])

    def issue_demand(self) -> None:
        """Give room to waiting demand units in order and queue their copies."""
        while self.waiting:
            u = self.waiting[0]
            ok = self.make_room(u.pool, u.nbytes, Reason.DEMAND, u.key) and self.vram.take_room(u, True)
            if not ok and self.cancel_queued(None, pool=u.pool):
                ok = self.make_room(u.pool, u.nbytes, Reason.DEMAND, u.key) and self.vram.take_room(u, True)
            if not ok:
                break
            self.waiting.pop(0)
            self.submit(u, DEMAND)

    def settle(self, u: Unit) -> None:
        """A resident unit in the transfer buffer whose layer is done with it: into its pool if
        the policy admits it and room can be made, else dropped."""
        if self.policy.admit(self.state.view, u.key) and self.make_room(u.pool, u.nbytes, Reason.ADMIT, u.key):
            self.vram.move_to_pool(u)
        else:
            self.drop(u)
