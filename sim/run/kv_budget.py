"""The KV cache of a run that models it in the VRAM budget: a batch run with
``workload.context_tokens`` > 0, or a serving run (``workload.arrivals``) whose model gives an
attention shape, whatever its starting context (its requests' own prompt and generated tokens
are held). Decision: the KV cache is held at the run's peak for the whole run (the largest batch's
context at its end: ``context_tokens`` plus every token of each request replayed, summed over the
batch), so the expert budget is fixed before the replay starts: what the cache asks, cut to what
VRAM holds after the non-expert weights, the transfer buffer and that KV cache. Exact for the
peak (no run holds more), conservative before it; no policy is asked to evict as the context
grows."""

from __future__ import annotations

from typing import Any

from moesim.sim.config.catalog import GIB, HardwareSpec, ModelSpec
from moesim.sim.config.scenario import ScenarioError
from moesim.sim.engine.workload import Workload


def kv_budget(source: str, given: str, model: ModelSpec, hw: HardwareSpec, wl: Workload, budget: int, buffer: int) -> int:
    """The expert budget of a run that models the KV cache: what the cache asks, cut to what VRAM
    holds after the weights, the transfer buffer and the KV cache at the run's peak
    (:func:`kv_bytes`, held for the whole run). A KV cache that does not fit beside the weights
    alone is one line naming it."""
    kv = kv_bytes(model, wl)
    vram = int(hw.vram_gib * GIB)
    room = vram - model.non_expert_bytes - buffer - kv
    if room < 0:
        if wl.serving is None:
            key, what, lower = "workload.context_tokens", "the KV cache at its peak", "workload.batch_size"
        else:
            key, what = "workload.scheduler.max_batch", "the KV cache of the running batch at its bound"
            lower = "workload.scheduler.max_batch or the requests' prompt and output lengths"
        raise ScenarioError(
            f"{source}: {key}: {what} ({kv / GIB:.2f} GiB: {wl.peak_kv_tokens} tokens "
            f"x {model.kv_bytes_per_token:g} B x {model.attention_blocks} layers) and the non-expert weights "
            f"({model.non_expert_bytes / GIB:.2f} GiB) + buffer ({buffer / GIB:.2f} GiB) exceed the {hw.vram_gib:g} GiB "
            f"of {hw.name}; lower workload.context_tokens or {lower}")
    if budget > room:
        budget = room // model.expert_bytes * model.expert_bytes
        if budget <= 0:
            raise ScenarioError(
                f"{source}: cache.{given}: beside the KV cache ({kv / GIB:.2f} GiB) and the non-expert weights "
                f"({model.non_expert_bytes / GIB:.2f} GiB) no expert fits in the {hw.vram_gib:g} GiB of {hw.name}")
    return budget


def kv_bytes(model: ModelSpec, wl: Workload) -> int:
    """Bytes of KV cache the run holds at its peak: the largest batch's context at its end
    (``wl.peak_kv_tokens``) x KV bytes per token and layer x the layers that keep a KV cache."""
    return int(wl.peak_kv_tokens * (model.kv_bytes_per_token or 0.0) * model.attention_blocks)


def context_metrics(model: ModelSpec, wl: Workload, budget: int) -> dict[str, Any]:
    """The metrics.json keys of a run that models the KV cache (absent otherwise, so that batch
    runs without a context keep their bytes): the starting context, the KV cache at its peak (tokens, bytes
    per token and layer, GiB) and the whole experts the budget held beside it."""
    return {"context_tokens": wl.context_tokens, "kv_peak_tokens": wl.peak_kv_tokens,
            "kv_bytes_per_token_layer": model.kv_bytes_per_token, "kv_gib": kv_bytes(model, wl) / GIB,
            "experts_held": budget // model.expert_bytes}


def kv_not_modelled(model: ModelSpec) -> str:
    """Why a serving run of ``model`` leaves its KV cache out (the summary and ``metrics.json``
    say it, rather than leaving it out silently)."""
    return (f"not modelled: model {model.name} gives no attention shape (attention_heads with kv_heads and head_dim, "
            "or kv_lora_rank), so attention's KV reads cost nothing and the KV cache takes no VRAM")
