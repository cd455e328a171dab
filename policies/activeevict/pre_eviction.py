"""ActiveEvict's prediction-guided pre-eviction (section 3.3), as a part that composes with any
cache rule.

As soon as layer ``l`` is routed (``after_layer``), the next router applied to ``l``'s hidden
state (the trace's ``lookahead_logits``) gives ``p_hat`` for layer ``l + 1``: the mean over the
iteration's tokens of its softmax (Eqs. 10-12, [rec]: T read as the tokens of the step). The
release target ``Delta`` (Eq. 17) says how many slots layer ``l + 1`` needs; the residents of
lowest importance (Eq. 13) are evicted until ``Delta`` slots are free ([rec] A3: slots already
free count), never one of the experts ``Delta`` counted ([rec] A4: the predicted top-k, and with
``boundary="nonresident"``, the default, the boundary experts below it that the redundancy of
Eq. 16 is for). With ``cache.swap_out`` their copies back to the host start now and overlap
layer ``l``'s loads and compute, instead of sitting before layer ``l + 1``'s demand loads. After the last layer, layer 0 of the next iteration is
the target (``cross_token``, [rec]: the last layer's lookahead is router 0's). Prefill
iterations are left alone ([rec] A10: the paper is decode-only). It never prefetches.

The part sits in a composition's prefetcher slot (the slot that acts in ``after_layer`` and
knows the cache) and issues no prefetch. It counts what it did: ``evictions`` (units it
evicted), ``fired`` (layers where it evicted) and ``regret`` (pre-evicted experts that the very
routing they were evicted for needed: the paper's premature-eviction redundancy);
a run in which it never evicted says so in its warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import starmap

import numpy as np

from moesim.policies.activeevict.importance import (
    BOUNDARY,
    REDUNDANCY,
    ImportanceScorer,
    descending,
    release_plan,
)
from moesim.policies.contract.base import (
    MISS,
    RESIDENT,
    Context,
    Outcome,
    PolicySetupError,
    UnitKey,
    View,
)
from moesim.policies.parts.prefetchers import Prefetcher

PREEVICT_AT = ("after_layer", "before_layer")


class PreEvictor(Prefetcher):
    """Evict, before layer ``l + 1`` is routed, the residents it will least need (see the module
    docstring). ``preevict_at="before_layer"`` issues the same evictions only in
    ``before_layer(l + 1)`` (the spec's A2 contrast: only attention is left to hide them)."""

    def __init__(self, scorer: ImportanceScorer, *, tau: float, r_max: int, redundancy: str = "literal",
                 boundary: str = "nonresident", cross_token: bool = True, preevict_at: str = "after_layer") -> None:
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        if r_max < 0:
            raise ValueError(f"r_max must be >= 0, got {r_max}")
        if redundancy not in REDUNDANCY:
            raise ValueError(f"redundancy must be one of {', '.join(REDUNDANCY)}, got {redundancy!r}")
        if boundary not in BOUNDARY:
            raise ValueError(f"boundary must be one of {', '.join(BOUNDARY)}, got {boundary!r}")
        if preevict_at not in PREEVICT_AT:
            raise ValueError(f"preevict_at must be one of {', '.join(PREEVICT_AT)}, got {preevict_at!r}")
        self.scorer = scorer
        self.tau = tau
        self.r_max = r_max
        self.redundancy = redundancy
        self.boundary = boundary
        self.cross_token = cross_token
        self.preevict_at = preevict_at

    def read_columns(self) -> frozenset[str]:
        """Reads ``lookahead_logits`` (without them: hotness stands in for the prediction)."""
        return frozenset({"lookahead_logits"})

    def uses_hook(self, name: str) -> bool:
        """``before_layer`` only with ``preevict_at="before_layer"``."""
        if name == "before_layer":
            return self.preevict_at == "before_layer"
        return super().uses_hook(name)

    def setup(self, ctx: Context) -> None:
        """Slots per layer (Eq. 5); no lookahead means hotness-only, reported."""
        if len(ctx.pool_capacity) != ctx.num_layers:
            raise PolicySetupError("pre-eviction needs one pool per layer (scope: layer)")
        self.scorer.setup(ctx.num_layers, ctx.num_experts)
        self._ctx = ctx
        self._k = ctx.top_k
        self._slots = [int(c // ctx.expert_bytes) for c in ctx.pool_capacity]
        self._lookahead = ctx.has_lookahead
        if not self._lookahead:
            ctx.warn("pre-eviction: the trace has no lookahead_logits; the layer's decayed usage stands "
                     "in for the predicted distribution (alpha = 1 in effect)")
        self._pending: tuple[int, int, list[float], list[int]] | None = None
        # per layer, the units pre-evicted for it (a regret when its routing misses one)
        self._mine: list[set[UnitKey]] = [set() for _ in range(ctx.num_layers)]
        self.evictions = 0
        self.fired = 0
        self.regret = 0
        self._silent_msg = ("pre-eviction never fired: every layer already had the slots its predicted "
                            "experts need (or no decode iteration ran)")

    # -- the prediction ---------------------------------------------------------------------------
    def predicted(self, view: View, layer: int, target: int) -> list[float]:
        """``p_hat`` of ``target`` after ``layer`` is routed: mean over tokens of the lookahead
        softmax (Eqs. 10-12), or the target's normalised decayed usage without lookahead."""
        return self._predicted(view.lookahead_probs(layer) if self._lookahead else None, target)

    def _predicted(self, sm: np.ndarray | None, target: int) -> list[float]:
        """``p_hat`` from the lookahead softmax ``sm`` (``view.lookahead_probs``), or from usage."""
        if sm is not None:
            if sm.shape[0] == 1:   # the mean of one row is the row (0 + p, divided by 1)
                return sm[0].tolist()
            return sm.mean(axis=0).astype(np.float64).tolist()
        u = self.scorer.usage(target)
        tot = u.sum()
        return (u / tot if tot > 0 else np.full_like(u, 1.0 / len(u))).tolist()

    def predicted_top(self, view: View, layer: int, p_hat: Sequence[float]) -> list[int]:
        """The predicted top-k: per token, united over the iteration's tokens ([rec] A10); with
        one token, the top-k of ``p_hat``."""
        return self._predicted_top(view.lookahead_logits(layer) if self._lookahead else None, p_hat)

    def _predicted_top(self, look: np.ndarray | None, p_hat: Sequence[float]) -> list[int]:
        if look is None or look.shape[0] == 1:
            return descending(p_hat)[: self._k]
        top: dict[int, None] = {}
        for row in np.asarray(look, dtype=np.float32):
            for e in np.argsort(-row, kind="stable")[: self._k]:
                top[int(e)] = None
        return list(top)

    # -- hooks ------------------------------------------------------------------------------------
    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Count executed experts; a pre-evicted expert that this routing needs is a regret."""
        self.scorer.observe_plan(view.iteration_index, layer, outcome.plan)
        mine = self._mine[layer]
        if not mine:
            return
        for e, st in zip(outcome.experts, outcome.status, strict=True):
            if st == MISS and (layer, e, 0) in mine:
                self.regret += 1
        mine.clear()

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        """A unit loaded back is no longer a pre-eviction that could be regretted."""
        self._mine[unit[0]].discard(unit)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Predict the next layer and free the slots it needs (or remember it for before_layer)."""
        if view.iteration.phase_name != "decode":
            return
        if layer + 1 < view.num_layers:
            target = layer + 1
        elif self.cross_token:
            target = 0
        else:
            return
        sm = view.lookahead_probs(layer) if self._lookahead else None
        p_hat = self._predicted(sm, target)
        # the logits only for the per-token top-k of several tokens (one token: p_hat's top-k)
        look = view.lookahead_logits(layer) if sm is not None and sm.shape[0] > 1 else None
        order = descending(p_hat) if look is None else None   # p_hat's ranks: its top-k, and Eq. 16's
        top = order[: self._k] if order is not None else self._predicted_top(look, p_hat)
        self.scorer.predicted[target] = p_hat
        if self.preevict_at == "after_layer":
            self.preevict(view, target, p_hat, top, order)
        else:
            self._pending = (target, view.iteration_index + (1 if target == 0 else 0), p_hat, top)

    def before_layer(self, view: View, layer: int) -> None:
        """``preevict_at="before_layer"``: the evictions decided after the previous layer."""
        pend = self._pending
        if pend is None:
            return
        target, it, p_hat, top = pend
        if target == layer and it == view.iteration_index:
            self.preevict(view, target, p_hat, top)
        self._pending = None

    def preevict(self, view: View, target: int, p_hat: Sequence[float] | np.ndarray, top: list[int],
                 order: list[int] | None = None) -> int:
        """Evict the lowest-``s`` residents of ``target`` until ``Delta`` slots are free; returns
        how many experts were evicted. ``order``: ``descending(p_hat)``, when the caller has it."""
        p = p_hat.astype(np.float64).tolist() if isinstance(p_hat, np.ndarray) else p_hat
        units = view.units_of_layer(target)
        present = {k[1] for k in units}
        delta, keep = release_plan(p, present, top, tau=self.tau, r_max=self.r_max,
                                   redundancy=self.redundancy, boundary=self.boundary, order=order)
        need = delta - (self._slots[target] - len(present))
        if need <= 0:
            return 0
        state, pinned = view.state, view.pinned
        residents = sorted({k[1] for k in units if state(*k) == RESIDENT})
        cands = [e for e in residents if e not in keep]   # pinned ones are skipped below
        if len(cands) > 1:   # one candidate needs no ranking
            s = self.scorer.scores(target, residents, p)
            cands.sort(key=lambda x: (s[x], x))
        done = 0
        for e in cands:
            if done >= need:
                break
            if pinned(target, e):
                continue
            keys = [k for k in units if k[1] == e]
            if all(starmap(view.evict, keys)):   # stops at the first that fails
                self._mine[target].update(keys)   # units of layer target
                self.evictions += len(keys)
                done += 1
        if done:
            self.fired += 1
        return done

    def on_iteration_end(self, view: View) -> None:
        """Keep the run's warnings true: say so while pre-eviction has never fired."""
        warnings = self._ctx.warnings
        if self.fired == 0:
            self._ctx.warn(self._silent_msg)
        elif self._silent_msg in warnings:
            warnings.remove(self._silent_msg)
