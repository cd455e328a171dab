"""What the fast replays do not reproduce: the features of a run that send it to the event loop
whatever its policy (:func:`replay_refusal`, shared by every fast replay), and the two more that
only the generic demand-only replay handles (:func:`kernel_refusal`: the kernels of
:mod:`moesim.sim.fast.order`, :mod:`moesim.sim.fast.static` and :mod:`moesim.sim.fast.prefetch`
model per-layer pools and lossless runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def replay_refusal(state: RunState[Transfers]) -> str | None:
    """Why ``state``'s run cannot take any fast replay, whatever its policy, or None: decision
    time, the timeline, swap-out, a transfer buffer, synchronous prefetch, experts split into
    parts. (Aborted copies need no check here: the demand-only replays issue no prefetch, and
    the prefetch kernel takes only policies that never abort, see
    :mod:`moesim.sim.fast.prefetch_check`.)"""
    if state.policy.decision_us:
        return "the policy spends decision time"
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


def kernel_refusal(state: RunState[Transfers]) -> str | None:
    """Why no kernel can replay ``state``'s run, or None: what :func:`replay_refusal` names, a
    lossy policy (its plans), or one global pool."""
    if state.policy.lossy:
        return "the policy plans (lossy)"
    if state.global_pool:
        return "the policy uses one global pool"
    return replay_refusal(state)
