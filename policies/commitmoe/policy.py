"""CommitMoE (Li, Sun, Lin, Sun, USTC: a fallback-free commit router for offloaded MoE
inference) and its "+Prefetch" ablation.

``commitmoe``: after layer ``l`` is routed, a Commit Router predicts each token's top-k experts
of layer ``l + 1`` (and, from the last layer, of layer 0 of the next token) and they are
prefetched. At the next layer the committed experts run, whatever the real router chose: no
fallback load, so a misprediction never adds a serialised transfer (section 4.1, Fig. 3c). The
true router's scores serve only the Output Weight Adjustment (Eqs. 5-6), which changes the
combination weights (the quality harness uses them; timing does not depend on them). Lossy.

``prefetch-fallback``: the same cache and predictor, prefetching the prediction, but the layer
runs as routed and mispredicted experts load on demand (the paper's "+Prefetch", section 5.3).
Under ``pcie.order: fifo`` a demand load queues behind every issued prefetch (the paper's
premise, Fig. 3b); under ``priority`` it jumps the queued ones, and ``cancel_mispredicted``
also withdraws the mispredicted prefetches still queued (pre-emptive cancellation).

Parameters, named as in the paper where it names them: ``alpha1``, ``alpha2`` (OWA, section 6:
Mixtral 1.20/1.06, Qwen 1.30/1.00, DeepSeek 1.15/1.00; neutral 1.0/1.0 is the default), ``owa``,
``owa_correct`` (the trigger set, default the paper's for the model's top-k), ``predictor``:

* ``lookahead``: the next layer's router on the current router input (the trace's
  ``lookahead_logits``), a zero-training stand-in for the paper's trained MLP (spec C1);
* ``auto`` (default): ``lookahead`` when the trace has ``lookahead_logits``, else
  ``previous-token`` (the routing of the target layer by the request's previous token; a request
  with no token in the previous iteration commits nothing), saying so in the run's warnings;
  ``previous-token`` can also be asked for;
* ``trained``: a per-layer linear map from the layer's router logits to the next router's
  distribution, fitted by Eq. (4)'s KL loss on the ``profile:`` split only
  (:class:`~moesim.policies.parts.predictors.TrainedPredictor`).

Both run on an LFU cache, as MoE-Infinity, which the paper builds on (spec C2). The run's
``policy_report`` says which predictor ran, its Eq. (3) accuracy histogram and the OWA triggers.
"""

from __future__ import annotations

from typing import Any

from moesim.policies.commitmoe.commit import Commitments, CommitPlanner, CommitPrefetcher
from moesim.policies.contract.base import PolicySetupError
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LFUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import (
    AutoPredictor,
    Predictor,
    TrainedPredictor,
    make_predictor,
)

COMMIT_PREDICTORS = ("auto", "lookahead", "trained", "previous-token")
"""The Commit Router's sources (``auto``: lookahead when the trace has it, else previous-token,
with a warning)."""


def commit_predictor(name: str) -> Predictor:
    """The Commit Router named ``name`` (one of :data:`COMMIT_PREDICTORS`)."""
    if name not in COMMIT_PREDICTORS:
        raise PolicySetupError(f"predictor must be one of {', '.join(COMMIT_PREDICTORS)}, got {name!r}")
    return make_predictor(name)


def predictor_needs(name: str, source: str) -> SetupNeeds:
    """What the Commit Router ``name`` reads: the lookahead (``auto``, ``lookahead``), the
    router logits and a profile split to fit on (``trained``), nothing (``previous-token``)."""
    if name in ("auto", "lookahead"):
        return SetupNeeds(columns=frozenset({"lookahead_logits"}), source=source)
    if name == "trained":
        return SetupNeeds(columns=frozenset({"logits"}), profile_share=DEFAULT_PROFILE_SHARE, source=source)
    return SetupNeeds(source=source)


COMMIT_SOURCE = ("CommitMoE section 4.1: the Commit Router predicts layer l+1 from layer l (the trace's "
                 "lookahead stands in for its trained MLP, spec C1)")
"""Where CommitMoE's setup needs come from (both of its policies)."""


def _predictor_report(name: str, predictor: Predictor) -> dict[str, Any]:
    out: dict[str, Any] = {"predictor": predictor.source if isinstance(predictor, AutoPredictor) else name}
    if isinstance(predictor, TrainedPredictor) and predictor.routers:
        fits = predictor.fitted
        out["predictor_fit"] = (f"linear, {len(fits)} layers, rows {min(f['rows'] for f in fits)}-"
                                f"{max(f['rows'] for f in fits)}, val KL mean "
                                f"{sum(f['val_kl'] for f in fits) / len(fits):.4f} nats")
    return out


@register
class CommitMoE(Composed):
    """Commit the predicted next-layer experts, prefetch them, run them without fallback."""

    name = "commitmoe"
    summary = "CommitMoE: run the predicted next-layer experts, no fallback load (lossy)"
    paper = "CommitMoE (Li, Sun, Lin, Sun, USTC): commit router, no fallback, OWA"
    lossy = True
    setup_needs = predictor_needs("auto", COMMIT_SOURCE)

    def __init__(self, *, predictor: str = "auto", cross_token: bool = True, owa: bool = True,
                 alpha1: float = 1.0, alpha2: float = 1.0, owa_correct: list[int] | None = None) -> None:
        self.predictor = predictor
        self.cross_token = cross_token
        self.owa = owa
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.owa_correct = owa_correct
        self._predictor = commit_predictor(predictor)
        store = Commitments()
        self.assemble(cache=LFUCache(),
                      prefetcher=CommitPrefetcher(self._predictor, commitments=store, cross_token=cross_token),
                      planner=CommitPlanner(store, owa=owa, alpha1=alpha1, alpha2=alpha2,
                                            owa_correct=None if owa_correct is None else frozenset(owa_correct)))

    def needs(self) -> SetupNeeds:
        """What its predictor reads."""
        return predictor_needs(self.predictor, COMMIT_SOURCE)

    def report(self) -> dict[str, Any]:
        """Which predictor ran (and its fit), then the planner's accuracy and OWA counts."""
        return {**_predictor_report(self.predictor, self._predictor), **super().report()}


@register
class PrefetchFallback(Composed):
    """CommitMoE's "+Prefetch" ablation: the Commit Router's prediction is prefetched, the layer
    runs as routed, mispredicted experts load on demand (lossless)."""

    name = "prefetch-fallback"
    summary = "+Prefetch (CommitMoE ablation): LFU + commit-router prefetch, misses load on demand"
    paper = "CommitMoE (Li, Sun, Lin, Sun, USTC), section 5.3 '+Prefetch' baseline"
    setup_needs = predictor_needs("auto", COMMIT_SOURCE)

    def __init__(self, *, predictor: str = "auto", cross_token: bool = True,
                 cancel_mispredicted: bool = False) -> None:
        self.predictor = predictor
        self.cross_token = cross_token
        self.cancel_mispredicted = cancel_mispredicted
        self._predictor = commit_predictor(predictor)
        self.assemble(cache=LFUCache(), prefetcher=CommitPrefetcher(
            self._predictor, cross_token=cross_token, cancel_mispredicted=cancel_mispredicted))

    def needs(self) -> SetupNeeds:
        """What its predictor reads."""
        return predictor_needs(self.predictor, COMMIT_SOURCE)

    def report(self) -> dict[str, Any]:
        """Which predictor ran, and how many queued prefetches were withdrawn."""
        out = _predictor_report(self.predictor, self._predictor)
        if self.cancel_mispredicted:
            out["cancelled_prefetches"] = self.prefetcher.cancelled if isinstance(self.prefetcher, CommitPrefetcher) else 0
        return out
