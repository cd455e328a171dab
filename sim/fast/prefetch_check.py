"""Eligibility of the next-layer prefetch kernel (:mod:`moesim.sim.fast.prefetch`): which runs
it replays exactly, and why it refuses the others (reported as the run's ``engine_path`` reason).

It takes the shipped :class:`~moesim.policies.baselines.speculative.MixtralOffloading` and
:class:`~moesim.policies.baselines.speculative.OraclePrefetch` as such (LRU cache, next-layer prefetcher,
no planner, no subclass) with a lookahead, previous-token or oracle predictor, on per-layer
pools with one copy lane (priority or fifo order) and whole experts; no swap-out, transfer buffer,
timeline, synchronous prefetch or VRAM invariant check, and a run that starts with every
present unit resident.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.baselines.speculative import MixtralOffloading, OraclePrefetch
from moesim.policies.contract.base import RESIDENT
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import (
    AutoPredictor,
    LookaheadPredictor,
    OraclePredictor,
    PreviousTokenPredictor,
)
from moesim.policies.parts.prefetchers import NextLayerPrefetcher
from moesim.sim.fast.refusal import run_refusal

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

_SOURCES = {LookaheadPredictor: "lookahead", PreviousTokenPredictor: "previous-token", OraclePredictor: "oracle"}


def is_prefetch_policy(state: RunState[Transfers]) -> bool:
    """The run's policy is the shipped mixtral-offloading or oracle-prefetch as such (no
    subclass, no part replaced): the kernel's policies, whether or not the rest of the run
    suits it."""
    p = state.policy
    return (type(p) in (MixtralOffloading, OraclePrefetch) and isinstance(p, Composed)
            and type(p.cache) is LRUCache and type(p.prefetcher) is NextLayerPrefetcher and p.planner is None)


def prefetch_source(state: RunState[Transfers]) -> str | None:
    """What the run's prefetcher predicts from: ``lookahead``, ``previous-token`` or ``oracle``
    (None: a predictor the kernel does not reproduce)."""
    pred: Any = state.policy.prefetcher.predictor   # type: ignore[attr-defined]
    if isinstance(pred, AutoPredictor):
        pred = pred.inner
    return _SOURCES.get(type(pred))


def prefetch_refusal(state: RunState[Transfers]) -> str | None:
    """Why the kernel cannot replay ``state``'s run exactly, or None (call after the policy's
    ``setup`` and the initial fill, on a run whose policy :func:`is_prefetch_policy` accepted)."""
    policy: Any = state.policy
    source = prefetch_source(state)
    if source is None:
        return f"the kernel does not reproduce predictor {policy.prefetcher.predictor.__class__.__name__}"
    if source == "lookahead":
        la = state.trace.lookahead_logits
        if la is None:
            return "the trace has no lookahead_logits"
        if la.dtype.kind != "f" or bool(np.isnan(la).any()):
            return "the lookahead logits are not plain floats (or hold NaN)"
    if source == "oracle" and bool((state.trace.experts < 0).any()):
        return "the trace has dropped routing slots (the oracle would prefetch expert -1)"
    why = run_refusal(state)
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
