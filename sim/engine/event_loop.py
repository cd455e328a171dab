"""The event loop: iterations x MoE layers on one GPU stream, with copy lanes, the VRAM budget,
an optional CPU for experts and the policy's hooks called in contract order.

The hook order and semantics are stated once, in :mod:`moesim.policies.contract.base`; this module
implements them. Its parts live beside it: :mod:`~moesim.sim.engine.gpu` (the GPU stream's process:
the loop of :mod:`~moesim.sim.engine.layer_loop`, the per-layer order below, on SimPy), :mod:`~moesim.sim.engine.vram` (byte accounting),
:mod:`~moesim.sim.engine.lanes` (H2D and D2H copy lanes), :mod:`~moesim.sim.engine.view` (the causal view),
:mod:`~moesim.sim.engine.records` (counters, step records, timeline); the run's state, which
they all share, is a :class:`~moesim.sim.engine.state.RunState`.

Per layer: the policy's ``before_layer``; the non-MoE compute (plus the runtime's overhead);
routing known, ``on_routed`` returns the plan; each planned expert part is resident (hit),
issued (late) or absent (a demand load, ahead of queued prefetches under priority order);
``on_access`` and ``after_layer`` run while the loads are under way; expert parts compute as
they become resident (ready ones first; see :mod:`moesim.sim.engine.layer_loop`) on the GPU, CPU slots on the CPU; ``on_layer_end``.
A demand load that finds no room waits (a stall), after the engine has withdrawn queued
prefetches of that pool. With ``swap_out`` an evicted unit drains to the host over the D2H
lane before its room frees; a prefetch whose room still drains waits for it (``WAITING``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import simpy

from moesim.policies.contract.base import Policy, Profile, check_columns
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.gpu import gpu_process
from moesim.sim.engine.placement import initial_fill, replayed_frequency
from moesim.sim.engine.records import RunStats
from moesim.sim.engine.replay import FastReplay
from moesim.sim.engine.splits import apply_fractions
from moesim.sim.engine.state import RunState
from moesim.sim.engine.transfers import BudgetError, PolicyError, Transfers
from moesim.sim.engine.view import EngineView
from moesim.sim.engine.workload import Workload

__all__ = ["BudgetError", "Engine"]


class Engine:
    """Replays a :class:`~moesim.sim.engine.workload.Workload` under a policy. Build, then
    :meth:`run`; the run's state, counters and records are in :attr:`state`."""

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
        serial_swap: bool = False,
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
        # every option by name (all keyword parameters but the replay itself): a fast replay
        # takes a run only if it declares each one (moesim.sim.fast.refusal)
        options = {k: v for k, v in locals().items() if k not in ("self", "workload", "policy", "cost", "budget_bytes",
                                                                  "fast_replay")}
        memory = cost.runtime.host_memory or policy.host_memory   # the runtime's choice, else the policy's
        if memory != cost.host_memory:   # a runtime or policy that does not pin its host copies
            cost = dataclasses.replace(cost, host_memory=memory)
        if policy.scope not in ("layer", "global"):
            raise PolicyError(f"policy {policy.name!r} has unknown scope {policy.scope!r}")
        env = self.env = simpy.Environment()
        self.fast_replay = fast_replay   # chosen by the caller (moesim.sim.run): the engine knows no kernel
        run: RunState[Transfers] = RunState.build(
            workload, policy, cost, budget_bytes=budget_bytes, buffer_bytes=buffer_bytes,
            initial=initial, seed=seed, profile=profile, stats=RunStats(),
            clock=lambda: float(env.now), swap_out=swap_out, record_steps=record_steps,
            record_timeline=record_timeline, check_invariants=check_invariants,
            sync_prefetch=sync_prefetch, progress=progress, options=options)
        run.view = EngineView(run)
        run.transfers = Transfers(run, env, swap_out=swap_out, pcie_order=pcie_order, serial_swap=serial_swap)
        self.state = run

    def run(self) -> RunStats:
        """Run the whole workload; returns the raw counters (also in ``state.stats``)."""
        run = self.state
        policy = run.policy
        vram = run.vram
        check_columns(policy, run.ctx.columns, run.trace.model.name)
        run.ctx.replayed_frequency = replayed_frequency(run.workload, run.trace, run.L, run.E)
        policy.setup(run.ctx)
        apply_fractions(run)
        need = max(run.part_bytes(layer, p) for layer in range(run.L) for p in range(len(run.fractions[layer])))
        if min(vram.capacity) + vram.buffer_capacity < need:
            per = min(vram.capacity) / run.expert_bytes
            raise BudgetError(
                f"the expert budget holds {per:.2f} experts per {'pool' if run.global_pool else 'layer'}; "
                "at least one expert is needed (raise cache.rate or cache.buffer_experts)")
        placed = initial_fill(run)
        run.stats.vram_peak_bytes = vram.peak
        policy.warm(run.view, placed)
        fast = self.fast_replay
        refusal = fast.refusal(run) if fast is not None else "the fast path is turned off"
        if refusal is None:
            assert fast is not None
            run.path = "fast"
            fast.run(run)
        else:
            run.path_reason = refusal or ""
            self._run_events()
        run.stats.vram_peak_bytes = vram.peak
        run.warnings.extend(run.ctx.warnings)
        if run.ctx.frequency_reads and run.ctx.profile is None:
            run.warnings.append(
                "offline expert popularity was taken from the replayed requests themselves (no "
                "profile: split given), an optimistic profile; give a profile: split for a fair one")
        return run.stats

    def _run_events(self) -> None:
        """The SimPy event loop over the whole workload."""
        run = self.state
        gpu = self.env.process(gpu_process(run, self.env))
        try:
            self.env.run(until=gpu)
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            it, layer = run.cur_iter.index, run.cur_layer
            raise PolicyError(f"the simulation stalled at iteration {it}, layer {layer}: the GPU waits "
                              f"for an event that nothing will trigger (policy {run.policy.name!r})") from None
