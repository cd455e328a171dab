"""Commitment: a prefetcher that predicts each token's next experts and prefetches them
(:class:`CommitPrefetcher`), and a planner that runs exactly those predicted experts instead of
the routed ones, with no fallback load (:class:`CommitPlanner`; CommitMoE section 4.1).

The two share a :class:`Commitments` store, keyed by (request, layer), so a prediction made after
layer ``l`` of one request is used at layer ``l + 1`` of that request, and the last layer's
prediction at layer 0 of the same request's next token (cross-token). Only decode iterations
commit (CommitMoE optimises decoding; a prefill runs as routed and only prefetches), so a
request's first decode token routes layer 0 normally. Without a planner the prefetcher alone is
the "+Prefetch" ablation: the prediction is prefetched, mispredicted experts load on demand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.commitmoe.owa import commit_accuracy, default_trigger, owa_weight_list
from moesim.policies.contract.base import Context, Outcome, Plan, Routing, View
from moesim.policies.parts.planners import Planner
from moesim.policies.parts.predictors import Predictor, top_experts
from moesim.policies.parts.prefetchers import Prefetcher

_DECODE = 1  # IterationInfo.phase of a decode step


class Commitments:
    """Predicted experts per (request, layer): ``[k]`` ids, best first, and their predicted
    probabilities (lists). A commitment is used once (taken by the planner)."""

    def __init__(self) -> None:
        self._store: dict[tuple[int, int], tuple[list[int], list[float] | None]] = {}

    def clear(self) -> None:
        """Forget every commitment."""
        self._store.clear()

    def put(self, request: int, layer: int, experts: list[int], probs: list[float] | None) -> None:
        """Commit ``request``'s next use of ``layer`` to ``experts`` (``probs`` None: the
        predictor gives no probabilities)."""
        self._store[(request, layer)] = (experts, probs)

    def take(self, request: int, layer: int) -> tuple[list[int], list[float] | None] | None:
        """The commitment of (request, layer), removed; None when there is none."""
        return self._store.pop((request, layer), None)


class CommitPrefetcher(Prefetcher):
    """After layer ``l`` is routed: each token's ``k`` likeliest experts of the next step under
    the predictor go into ``commitments`` (decode iterations only, when a store is given), and
    their union is prefetched into the target layer, priority = best predicted probability.
    The target is ``l + 1``, or layer 0 of the next iteration after the last layer when
    ``cross_token``. ``cancel_mispredicted`` withdraws, once a layer is routed, its queued
    prefetches that the plan does not use (only under ``pcie.order: priority``; under fifo issued
    copies cannot be withdrawn)."""

    def __init__(self, predictor: Predictor, *, commitments: Commitments | None = None,
                 cross_token: bool = True, cancel_mispredicted: bool = False) -> None:
        self.predictor = predictor
        self.commitments = commitments
        self.cross_token = cross_token
        self.cancel_mispredicted = cancel_mispredicted
        self._k = 0
        self.cancelled = 0
        # request ids of this iteration's and the previous iteration's tokens (a predictor whose
        # rows are the previous iteration's tokens is matched to requests with them)
        self._iteration = -1
        self._requests: np.ndarray | None = None
        self._previous_requests: np.ndarray | None = None

    def required_columns(self) -> frozenset[str]:
        """The predictor's."""
        return self.predictor.required_columns()

    def read_columns(self) -> frozenset[str]:
        """The predictor's."""
        return self.predictor.read_columns()

    def setup(self, ctx: Context) -> None:
        """Set up the predictor; forget earlier commitments."""
        self._k = ctx.top_k
        self.cancelled = 0
        self._iteration, self._requests, self._previous_requests = -1, None, None
        self.predictor.setup(ctx)
        if self.commitments is not None:
            self.commitments.clear()

    def uses_hook(self, name: str) -> bool:
        """``on_access`` only when cancelling mispredicted prefetches."""
        if name == "on_access":
            return self.cancel_mispredicted
        return super().uses_hook(name)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Withdraw the layer's queued prefetches that nothing planned uses (planned units are
        pinned by now, and pinned units are never withdrawn)."""
        self.cancelled += view.cancel_prefetches(layer)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Predict, commit (decode only) and prefetch the next step."""
        it = view.iteration
        if it.index != self._iteration:
            self._iteration, self._previous_requests, self._requests = it.index, self._requests, it.request_ids
        if layer + 1 < view.num_layers:
            target = layer + 1
        elif self.cross_token:
            target = 0
        else:
            return
        scores = self.predictor.token_scores(view, layer)
        if scores is None:
            return
        k = min(self._k, scores.shape[1])
        commit = self.commitments is not None and it.phase == _DECODE
        if commit and self.predictor.rows_from_previous_iteration(layer, view.num_layers):
            self._commit_by_request(it.request_ids, target, scores, k)
            commit = False
        if isinstance(scores, np.ndarray) and scores.shape[0] == 1 and scores.dtype.char in "ef":
            row = scores.tolist()[0]   # one row of float16/32: the same values as Python floats
            total = sum(row)
            if total == total:   # no NaN: the stable descending order is argsort's and top_experts'
                top = sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]
                if commit:
                    assert self.commitments is not None
                    self.commitments.put(int(view.iteration.request_ids[0]), target, top,
                                         [row[e] for e in top] if self.predictor.probabilistic else None)
                self.prefetch_set(view, target, [(e, row[e]) for e in top])
                return
        if commit:
            assert self.commitments is not None
            reqs = view.iteration.request_ids
            probabilistic = self.predictor.probabilistic
            for t in range(scores.shape[0]):
                best = np.argsort(-scores[t], kind="stable")[:k]
                self.commitments.put(int(reqs[t]), target, best.tolist(),
                                     scores[t, best].astype(np.float64).tolist() if probabilistic else None)
        self.prefetch_set(view, target, top_experts(scores, k))

    def _commit_by_request(self, requests: np.ndarray, target: int, scores: np.ndarray, k: int) -> None:
        """Commit each token of this iteration to the ``k`` best experts of the previous
        iteration's row of its request (its previous token: the last such row); a request that
        had no token there gets no commitment and runs as routed."""
        assert self.commitments is not None
        previous = self._previous_requests
        if previous is None or len(previous) != scores.shape[0]:
            return
        last = {int(r): j for j, r in enumerate(previous.tolist())}
        probabilistic = self.predictor.probabilistic
        for r in requests.tolist():
            j = last.get(int(r))
            if j is None:
                continue
            best = np.argsort(-scores[j], kind="stable")[:k]
            self.commitments.put(int(r), target, best.tolist(),
                                 scores[j, best].astype(np.float64).tolist() if probabilistic else None)


class CommitPlanner(Planner):
    """Runs each token's committed experts instead of the routed ones (no fallback); a token
    without a commitment runs as routed. Plan weights are the predictor's probabilities of the
    committed experts (``G_pred``; none when the predictor has no probabilities, so that the
    quality harness weighs by the true router's scores, spec sheet C7's alternative), or OWA's ``G''`` (Eqs. 5-6) when ``owa`` and the number of
    correct experts is in ``owa_correct`` (default: the paper's set for the model's top-k) and the
    trace has router ``weights``. Counts the Eq. (3) accuracy of every commitment and the OWA
    triggers for the run's report."""

    def __init__(self, commitments: Commitments, *, owa: bool = True, alpha1: float = 1.0,
                 alpha2: float = 1.0, owa_correct: frozenset[int] | None = None) -> None:
        if alpha1 <= 0 or alpha2 <= 0:
            raise ValueError("alpha1 and alpha2 must be > 0")
        self.commitments = commitments
        self.owa = owa
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.owa_correct = owa_correct
        self._trigger: frozenset[int] = frozenset()
        self.accuracy: dict[int, int] = {}
        self.owa_triggered = 0
        self.committed = 0
        self._pct: dict[tuple[int, int], int] = {}   # commit_accuracy(correct, k), as computed

    def setup(self, ctx: Context) -> None:
        """Resolve the trigger set; reset the counters."""
        self._trigger = default_trigger(ctx.top_k) if self.owa_correct is None else frozenset(self.owa_correct)
        self.accuracy = {}
        self.owa_triggered = 0
        self.committed = 0

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """The committed experts of every token that has a commitment for ``layer``."""
        if view.iteration.phase != _DECODE:
            return None
        reqs = view.iteration.request_ids.tolist()
        routed = routing.experts
        tw = routing.weights
        rows = routed.tolist()
        width = routed.shape[1]
        plan_rows = rows[:]                      # rows are replaced, never changed in place
        w_rows = None if tw is None else tw.tolist()
        take = self.commitments.take
        pct_of = self._pct
        changed = unweighted = False
        for t in range(routing.n_tokens):
            got = take(reqs[t], layer)   # request ids as Python ints (tolist)
            if got is None:
                continue
            experts, probs = got
            k = min(len(experts), width)
            experts = experts[:k]
            true = rows[t]
            c = len(set(experts) & set(true))
            pct = pct_of.get((c, len(true)))
            if pct is None:   # Eq. (3), once per (correct, k)
                pct = pct_of[(c, len(true))] = commit_accuracy(c, len(true))
            self.accuracy[pct] = self.accuracy.get(pct, 0) + 1
            self.committed += 1
            plan_rows[t] = experts + [-1] * (width - k)
            if probs is None:
                unweighted = True      # the quality harness then weighs by the true router
            elif w_rows is not None and tw is not None:
                w = probs[:k]
                if self.owa and c in self._trigger:
                    w = owa_weight_list(true, w_rows[t], experts, probs,   # row t: not yet replaced
                                        alpha1=self.alpha1, alpha2=self.alpha2)
                    self.owa_triggered += 1
                w_rows[t] = w + [0.0] * (width - k)
            changed = True
        if not changed:
            return None
        weights = None if unweighted or w_rows is None else np.array(w_rows, dtype=np.float64)
        return Plan(np.array(plan_rows, dtype=np.int64), weights=weights)

    def report(self) -> dict[str, Any]:
        """Commitments made, their Eq. (3) accuracy histogram (percent -> count) and OWA triggers."""
        return {"committed_token_layers": self.committed,
                "commit_accuracy_pct": {str(p): n for p, n in sorted(self.accuracy.items())},
                "owa_triggered": self.owa_triggered}
