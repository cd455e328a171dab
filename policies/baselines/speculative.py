"""LRU caches with next-layer prefetch: ``mixtral-offloading`` (speculative, from the router's
lookahead) and ``oracle-prefetch`` (perfect knowledge of the next layer: a bound)."""

from __future__ import annotations

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import OraclePredictor, make_predictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher


@register
class MixtralOffloading(Composed):
    """LRU expert cache per layer plus speculative prefetch of the next layer's experts
    (Eliseev & Mazur, 2023): when layer ``l`` is routed, the router of ``l + 1`` applied to the
    hidden state of ``l`` (the trace's ``lookahead_logits``) guesses the next experts, which load
    into the next layer's LRU cache in the background.

    ``prefetch_experts`` experts per token are guessed (default ``top_k``). ``predictor``:
    ``lookahead`` needs ``lookahead_logits``; ``previous-token`` guesses the previous token's
    routing of layer ``l + 1``; ``auto`` takes lookahead when the trace has it (and warns when it
    has not). ``cross_token`` also prefetches layer 0 of the next iteration from the last layer.

    The paper's text is the source of the speculative part: the authors' released code
    (github.com/dvmazur/mixtral-offloading, every branch) has none, its README listing
    "Speculative expert prefetching" as not yet available. Its LRU part follows that code
    (src/expert_cache.py, src/build_model.py): one eviction group per layer, the experts a layer
    routes marked used before a victim is chosen (a layer never evicts its own), a loaded expert
    entering its group as the most recent; a guessed set here enters its layer's pool the same
    way and never evicts its own members. Not taken as the default: there a miss swaps, the
    evicted expert copied back to a pinned host slot on the same stream (``cache.swap_out`` with
    ``serial_swap``, a scenario's choice).
    """

    name = "mixtral-offloading"
    summary = "LRU + speculative next-layer prefetch from the router lookahead"
    paper = "Eliseev & Mazur, Fast Inference of Mixture-of-Experts Language Models with Offloading (2023)"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}),
                             source="Eliseev & Mazur (2023): the next layer's gate on the current hidden state")

    def __init__(self, *, prefetch_experts: int | None = None, predictor: str = "auto",
                 cross_token: bool = False) -> None:
        self.prefetch_experts = prefetch_experts
        self.predictor = predictor
        self.cross_token = cross_token
        self.assemble(cache=LRUCache(), prefetcher=NextLayerPrefetcher(
            make_predictor(predictor), experts=prefetch_experts, cross_token=cross_token))

    def needs(self) -> SetupNeeds:
        """The lookahead only for the predictors that read it (``auto``, ``lookahead``)."""
        needs = super().needs()
        return needs if self.predictor in ("auto", "lookahead") else needs.without(columns={"lookahead_logits"})


@register
class OraclePrefetch(Composed):
    """LRU cache plus a perfect next-layer prefetcher: after layer ``l`` is routed it loads
    exactly the experts the recorded routing uses at ``l + 1`` (and at layer 0 of the next
    iteration). Reads the future: the bound for next-layer prefetchers."""

    name = "oracle-prefetch"
    oracle = True
    setup_needs = SetupNeeds()
    summary = "oracle: LRU + exact next-layer prefetch (bound for prefetchers)"

    def __init__(self) -> None:
        self.assemble(cache=LRUCache(), prefetcher=NextLayerPrefetcher(OraclePredictor(), cross_token=True))
