"""Eligibility of the next-layer prefetch kernel (:mod:`moesim.sim.fast.prefetch`): which runs
it replays exactly, and why it refuses the others (reported as the run's ``engine_path`` reason).

It takes a policy made of an ``lru`` cache rule and a ``next-layer`` prefetcher and nothing else
(the shipped ``mixtral-offloading`` and ``oracle-prefetch``; the names the parts declare,
:mod:`moesim.sim.fast.capability`) with a lookahead, previous-token or oracle predictor, on
per-layer pools with one copy lane (priority or fifo order) and whole experts; no swap-out,
transfer buffer, timeline, synchronous prefetch or VRAM invariant check, and a run that starts
with every present unit resident. None of these parts ever aborts a copy in flight
(``view.abort_prefetch``), which the kernel does not model; a policy that may (MoEpic, or a
composition with a hook of its own) is not taken and runs on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from moesim.policies.contract.base import RESIDENT
from moesim.sim.fast.capability import next_layer_parts, predictor_source
from moesim.sim.fast.refusal import kernel_refusal

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers


def is_prefetch_policy(state: RunState[Transfers]) -> bool:
    """The run's policy is one the kernel stands in for (an ``lru`` rule and a ``next-layer``
    prefetcher alone), whether or not the rest of the run suits it."""
    return next_layer_parts(state.policy) is not None


def prefetch_source(state: RunState[Transfers]) -> str | None:
    """What the run's prefetcher predicts from: ``lookahead``, ``previous-token`` or ``oracle``
    (None: a predictor the kernel does not reproduce, or no prefetch policy)."""
    parts = next_layer_parts(state.policy)
    return None if parts is None else predictor_source(parts[1])


def prefetch_refusal(state: RunState[Transfers]) -> str | None:
    """Why the kernel cannot replay ``state``'s run exactly, or None (call after the policy's
    ``setup`` and the initial fill, on a run whose policy :func:`is_prefetch_policy` accepted)."""
    parts = next_layer_parts(state.policy)
    assert parts is not None, "not a policy of the prefetch kernel"
    source = predictor_source(parts[1])
    if source is None:
        return f"the kernel does not reproduce predictor {parts[1].predictor.__class__.__name__}"
    if source == "lookahead":
        la = state.trace.lookahead_logits
        if la is None:
            return "the trace has no lookahead_logits"
        if la.dtype.kind != "f" or bool(np.isnan(la).any()):
            return "the lookahead logits are not plain floats (or hold NaN)"
    if source == "oracle" and bool((state.trace.experts < 0).any()):
        return "the trace has dropped routing slots (the oracle would prefetch expert -1)"
    why = kernel_refusal(state)
    if why is not None:
        return why
    if state.check_invariants:
        return "the VRAM invariant is checked"
    if state.cost.prefetch_issue_s():
        return "runtime.prefetch_issue_us is set (the kernel does not charge it)"
    if int(state.cost.hardware.copy_engines) != 1:
        return "the kernel models one copy engine"
    if any(u.state != RESIDENT or not u.used for u in state.vram.units.values()):
        return "the run starts with transfers under way"
    return None
