"""The event loop: iterations x MoE layers on one GPU stream, with copy lanes, the VRAM budget,
an optional CPU for experts and the policy's hooks called in contract order.

The hook order and semantics are stated once, in :mod:`moesim.policies.contract.base`; this module
implements them. Its parts live beside it: :mod:`~moesim.sim.engine.gpu` (the GPU stream's process,
the per-layer loop below), :mod:`~moesim.sim.engine.vram` (byte accounting),
:mod:`~moesim.sim.engine.lanes` (H2D and D2H copy lanes), :mod:`~moesim.sim.engine.view` (the causal view),
:mod:`~moesim.sim.engine.records` (counters, step records, timeline).

Per layer: the policy's ``before_layer``; the non-MoE compute (plus the runtime's overhead);
routing known, ``on_routed`` returns the plan; each planned expert part is resident (hit),
issued (late) or absent (a demand load, ahead of queued prefetches under priority order);
``on_access`` and ``after_layer`` run while the loads are under way; expert parts compute as
they become resident (ready ones first; see :mod:`moesim.sim.engine.gpu`) on the GPU, CPU slots on the CPU; ``on_layer_end``.
A demand load that finds no room waits (a stall), after the engine has withdrawn queued
prefetches of that pool. With ``swap_out`` an evicted unit drains to the host over the D2H
lane before its room frees; a prefetch whose room still drains waits for it (``WAITING``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import simpy

from moesim.policies.contract.base import (
    INFLIGHT,
    OPTIONAL_COLUMNS,
    QUEUED,
    RESIDENT,
    Context,
    Policy,
    Profile,
    Reason,
    Routing,
    check_columns,
)
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.gpu import gpu_process
from moesim.sim.engine.placement import initial_fill, replayed_frequency
from moesim.sim.engine.records import RunStats, StepRecords, TimelineEvent
from moesim.sim.engine.replay import FastReplay
from moesim.sim.engine.transfers import PolicyError, Transfers
from moesim.sim.engine.view import EngineView
from moesim.sim.engine.vram import Unit, Vram
from moesim.sim.engine.workload import Iteration, Workload


class BudgetError(MoesimError, ValueError):
    """The expert budget cannot hold what the run needs (less than one expert per pool, or a
    pool that can evict nothing while a demand load waits)."""


class Engine:
    """Replays a :class:`~moesim.sim.engine.workload.Workload` under a policy. Build, then :meth:`run`."""

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
        fast_replay: FastReplay | None = None,
    ) -> None:
        tr = workload.trace
        m = tr.model
        if policy.host_memory != cost.host_memory:   # a runtime that does not pin its host copies
            cost = dataclasses.replace(cost, host_memory=policy.host_memory)
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
        self.fast_replay = fast_replay   # chosen by the caller (moesim.sim.run): the engine knows no kernel
        self.path = "event"           # which replay ran: "fast" (sim/fast/path.py) or "event" (SimPy)
        self.path_reason = ""         # why the fast path was not taken
        self.fast_now: float | None = None   # the clock of a fast replay (SimPy's env.now otherwise)
        pol_seed, eng_seed = np.random.SeedSequence(seed).spawn(2)
        self.rng = np.random.default_rng(eng_seed)

        if policy.scope not in ("layer", "global"):
            raise PolicyError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        self.global_pool = policy.scope == "global"
        caps = [int(budget_bytes)] if self.global_pool else [int(budget_bytes) // self.L] * self.L
        self.vram = Vram(caps, buffer_bytes)
        self.fractions: list[tuple[float, ...]] = [(1.0,)] * self.L
        self._policy_splits = policy.uses_hook("part_fractions")
        self.stats = RunStats()
        self.transfers = Transfers(self.env, self.vram, policy, self.view, cost, self.stats, self.timeline,
                                   num_layers=self.L, num_experts=self.E, global_pool=self.global_pool,
                                   fractions=self.fractions, swap_out=swap_out, pcie_order=pcie_order,
                                   record_timeline=record_timeline, spend_issue=self._spend_issue)
        self.spent_s = 0.0            # host time (policy CPU, prefetch issue) not yet charged on the GPU stream
        self.issue_spent_s = 0.0      # the part of spent_s that is runtime.prefetch_issue_us
        self.cpu_free_at = 0.0        # when the CPU finishes the experts queued on it
        self.cur_layer = -1
        self.routed_upto = -1
        self.cur_iter = workload.iterations[0]
        self.prev_iter: Iteration | None = None
        self.emb_index = (
            {int(r): i for i, r in enumerate(tr.embedding_rows)} if tr.embedding_rows is not None else None
        )
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
        return self.transfers.part_bytes(layer, part)

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
        if not self._policy_splits:   # part_fractions not overridden: every layer keeps (1.0,)
            return
        for layer in range(self.L):
            fr = tuple(float(f) for f in self.policy.part_fractions(layer))
            if fr != self.fractions[layer]:
                self.set_fractions(layer, fr)

    # ------------------------------------------------------------------------------------------
    # processes
    def _check_deadlock(self, layer: int) -> None:
        busy = (any(u.state in (QUEUED, INFLIGHT) for u in self.vram.units.values())
                or self.vram.draining_any())
        if not busy:
            u = self.transfers.waiting[0]
            raise BudgetError(
                f"the expert budget is too small: layer {layer} needs {u.nbytes} bytes for expert "
                f"{u.key[1]} but its pool holds {self.vram.capacity[u.pool]} bytes and policy "
                f"{self.policy.name!r} can evict none of them (pinned or refused); raise "
                "cache.rate or cache.buffer_experts")

    def _spend_issue(self, seconds: float) -> None:
        """A prefetch was issued: its host cost waits in ``spent_s`` for the next charge."""
        self.spent_s += seconds
        self.issue_spent_s += seconds

    def _settle(self, u: Unit) -> None:
        """A resident unit in the transfer buffer whose layer is done with it: it moves into its
        pool if the policy admits it and room can be made, else it is dropped."""
        if self.policy.admit(self.view, u.key) and self.transfers.make_room(u.pool, u.nbytes, Reason.ADMIT, u.key)[0]:
            self.vram.move_to_pool(u)
        else:
            self.transfers.drop(u)

    def _settle_buffer(self, layer: int) -> None:
        """After ``layer`` computed, settle its resident units still in the transfer buffer."""
        for key, u in list(self.vram.units.items()):
            if u.in_buffer and u.state == RESIDENT and key[0] == layer:
                self._settle(u)

    # ------------------------------------------------------------------------------------------
    def run(self) -> RunStats:
        """Run the whole workload; returns the raw counters (also in ``self.stats``)."""
        policy = self.policy
        check_columns(policy, self.ctx.columns, self.trace.model.name)
        self.ctx.replayed_frequency = replayed_frequency(self.workload, self.trace, self.L, self.E)
        policy.setup(self.ctx)
        self._apply_fractions()
        need = max(self.part_bytes(layer, p) for layer in range(self.L) for p in range(len(self.fractions[layer])))
        if min(self.vram.capacity) + self.vram.buffer_capacity < need:
            per = min(self.vram.capacity) / self.expert_bytes
            raise BudgetError(
                f"the expert budget holds {per:.2f} experts per {'pool' if self.global_pool else 'layer'}; "
                "at least one expert is needed (raise cache.rate or cache.buffer_experts)")
        placed = initial_fill(self)
        self.stats.vram_peak_bytes = self.vram.peak
        policy.warm(self.view, placed)
        fast = self.fast_replay
        refusal = fast.refusal(self) if fast is not None else "the fast path is turned off"
        if refusal is None:
            assert fast is not None
            self.path = "fast"
            fast.run(self)
        else:
            self.path_reason = refusal or ""
            self._run_events()
        self.stats.vram_peak_bytes = self.vram.peak
        self.warnings.extend(self.ctx.warnings)
        if self.ctx.frequency_reads and self.ctx.profile is None:
            self.warnings.append(
                "offline expert popularity was taken from the replayed requests themselves (no "
                "profile: split given), an optimistic profile; give a profile: split for a fair one")
        return self.stats

    def now(self) -> float:
        """Simulated time in seconds (the fast replay's clock, or SimPy's)."""
        return self.fast_now if self.fast_now is not None else float(self.env.now)

    def _run_events(self) -> None:
        """The SimPy event loop over the whole workload."""
        policy = self.policy
        gpu = self.env.process(gpu_process(self))
        try:
            self.env.run(until=gpu)
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            it, layer = self.cur_iter.index, self.cur_layer
            raise PolicyError(f"the simulation stalled at iteration {it}, layer {layer}: the GPU waits "
                              f"for an event that nothing will trigger (policy {policy.name!r})") from None

