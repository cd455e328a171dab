"""``lfru``: vLLM's proposed expert cache (vllm-project/vllm PR #37190,
``--moe-expert-cache-size N``): N slots per MoE layer, LFRU eviction
(:mod:`moesim.policies.parts.lfru`), no prefetch."""

from __future__ import annotations

from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.lfru import LFRUCache


@register
class LFRU(Composed):
    """Per-layer cache evicting the least ``freq / (clock - last + 1)``, clock ticking once per
    distinct expert a layer's pass uses, frequency forgotten on eviction, ties to the entry
    inserted first. The cache size is the scenario's budget per layer
    (``cache.experts_per_layer`` = ``--moe-expert-cache-size``)."""

    name = "lfru"
    summary = "evict the least freq / age expert of the layer (vLLM PR #37190's LFRU)"
    paper = ("vllm-project/vllm PR #37190, expert CPU offloading with a GPU cache "
             "(--moe-expert-cache-size), LFRU eviction")
    setup_needs = SetupNeeds()

    def __init__(self) -> None:
        self.assemble(cache=LFRUCache())
