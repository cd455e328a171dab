"""What no fast replay reproduces: the features of a run that send it to the event loop
whatever its policy (shared by :func:`moesim.sim.fast.path.fast_path_refusal` and
:func:`moesim.sim.fast.prefetch_check.prefetch_refusal`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def run_refusal(state: RunState[Transfers]) -> str | None:
    """Why ``state``'s run cannot take any fast replay, whatever kernel its policy has, or
    None: a lossy plan or decision time, one global pool, the timeline, swap-out, a transfer
    buffer, synchronous prefetch, experts split into parts. (Aborted copies need no check here:
the demand-only replays issue no prefetch, and the prefetch kernel takes only policies that
never abort, see :mod:`moesim.sim.fast.prefetch_check`.)"""
    policy = state.policy
    if policy.lossy or policy.decision_us:
        return "the policy plans or spends decision time"
    if state.global_pool:
        return "the policy uses one global pool"
    if state.record_timeline:
        return "the timeline is recorded"
    if state.transfers.d2h is not None:
        return "cache.swap_out is on"
    if state.vram.buffer_capacity:
        return "a transfer buffer is set"
    if state.sync_prefetch:
        return "pcie.sync_prefetch is on"
    if any(len(fr) != 1 for fr in state.fractions):
        return "experts are split into parts"
    return None
