"""What the fast replays reproduce, declared, so that they fail closed: every option of the
engine (:class:`~moesim.sim.engine.event_loop.Engine`'s keyword parameters, recorded in the run's
``options``), every field of the cost model's specs (model, hardware, its calibrated costs and
host CPU, runtime) and of the workload is named here with the values the fast replays take. A run
with an option or a field that is not named here (a new engine mechanism, a new cost term) goes
to the event loop until someone declares it, after checking that the fast replays reproduce it.

:func:`undeclared` is the check every fast replay makes (the driver, :mod:`moesim.sim.fast.driver`,
needs no other); :func:`kernel_refusal` adds what only the driver handles (the kernels of
:mod:`moesim.sim.fast.order` and :mod:`moesim.sim.fast.prefetch`
model per-layer pools, lossless runs of whole experts without decision time, a fixed list of
iterations (no serving run), and no timeline, transfer buffer or synchronous prefetch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from moesim.policies.contract.base import RESIDENT

if TYPE_CHECKING:
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.transfers import Transfers

Check = Callable[[Any], str | None]
"""A declared option's check: why the fast replays refuse its value, or None."""


def _any(_value: Any) -> None:
    """Any value: the replays reproduce it (it sets what is replayed or recorded, not how)."""
    return None


def _off(why: str) -> Check:
    """Only the option's off value (false, zero, None)."""
    def check(value: Any) -> str | None:
        return why if value else None
    return check


ENGINE_OPTIONS: dict[str, Check] = {
    "record_timeline": _any,      # the driver records it as the event loop does; the kernels refuse it (KERNEL_OPTIONS)
    "swap_out": _any,             # the driver's device-to-host lane; the kernels refuse it (KERNEL_OPTIONS)
    "buffer_bytes": _any,         # likewise
    "sync_prefetch": _any,        # likewise
    "serial_swap": _any,          # acts only with swap_out (Transfers.grant_waiting, which the driver calls)
    "pcie_order": _any,           # the driver's lanes and the prefetch kernel model both orders
    "initial": _any,
    "seed": _any,
    "profile": _any,
    "record_steps": _any,
    "check_invariants": _any,     # the driver checks it as the event loop does; the kernels keep their own books (KERNEL_OPTIONS)
    "progress": _any,
}
"""The engine's options (``Engine.__init__``'s keyword parameters) the fast replays declare."""

KERNEL_OPTIONS: dict[str, Check] = {
    "check_invariants": _off("the VRAM invariant is checked"),
    "swap_out": _off("cache.swap_out is on"),
    "record_timeline": _off("the timeline is recorded"),
    "buffer_bytes": lambda v: "a transfer buffer is set" if int(v) else None,
    "sync_prefetch": _off("pcie.sync_prefetch is on"),
}
"""The options the kernels refuse besides (the driver takes them)."""

SPEC_FIELDS: dict[str, frozenset[str]] = {
    # sizes and costs: read only through the cost model's functions, which every replay calls
    # pcie_gen and pcie_lanes: the bound a fit keeps pcie_gbps under (never read by the engine)
    # dense_blocks: where llama.cpp's flag counts from (advise's placement), never read by the engine
    # the attention fields, kv_read_gbps, attention_tflops and layer_us_per_context_token: read only by
    # CostModel.context_s, through Stepper.non_moe_s, which every replay calls
    "model": frozenset({"attention_heads", "attention_source", "head_dim", "kv_dtype_bytes", "kv_heads",
                        "kv_lora_rank", "qk_rope_head_dim", "dense_blocks", "dtype_bytes",
                        "expert_intermediate_size", "hidden_size", "name", "non_expert_bytes",
                        "num_experts", "num_layers", "num_shared_experts", "shared_expert_intermediate_size",
                        "top_k"}),
    "hardware": frozenset({"attention_tflops", "copy_engines", "costs", "cpu", "d2h_gbps", "device", "evict_us",
                           "hbm_gbps", "kernel_us", "kv_read_gbps", "name", "pageable_gbps", "pcie_gbps", "pcie_gen",
                           "pcie_lanes", "pcie_latency_us", "peak_tflops", "source", "sources", "vram_gib"}),
    "hardware.costs": frozenset({"expert_us", "expert_us_per_token", "head_us", "layer_us", "layer_us_per_token",
                                 "layer_us_per_context_token"}),
    # sockets, peak_gbps, peak_tflops: sockets read only by CpuSpec.read_gbps/compute_tflops (CostModel.cpu_expert_s),
    # the peaks only by CpuSpec's check and a fit's bounds; numa_unaware_gbps only by CpuSpec.runtime_read_gbps
    # (CostModel.host_read_gbps: cpu_expert_s, and host_attention_s through Stepper.non_moe_s, which every replay calls)
    "hardware.cpu": frozenset({"busy_fraction", "call_us", "cores", "expert_us", "expert_us_by_tokens",
                               "expert_us_per_token", "mem_gbps", "name", "numa_unaware_gbps", "peak_gbps", "peak_tflops", "sockets",
                               "source", "sources", "tflops", "thread_gbps", "threads"}),
    # demand_load_us and prefetch_issue_us: the kernels that do not charge them refuse them themselves
    # pageable_copy_us: read only by CostModel.transfer_s, which every replay calls for its copies
    # launch_us, layer_kernels, cuda_graphs, eager_prefill: read only by CostModel.overhead_layer_s, and
    # eager_score_bytes, static_cache_pad_tokens only by CostModel.eager_attention_s, both through
    # Stepper.non_moe_s, which every replay calls
    # host_memory: read only by the event loop, which sets the cost model's host_memory from it before any
    # replay starts; every replay's copies go through CostModel.transfer_s, which reads that
    # cpu_switch_us and activation_copies: paid only by Stepper.cpu_experts (CostModel.cpu_switch_s), for a
    # layer with CPU experts; no fast replay runs CPU experts (path.py and the kernels refuse such plans)
    # kv_on_host: read only by CostModel.context_s and kv_host_switch_s, both through Stepper.non_moe_s, which
    # every replay calls
    # cpu_kernel: read only by CostModel.cpu_expert_s (CPU experts, which no fast replay runs); numa_aware only by
    # CostModel.host_read_gbps (as hardware.cpu.numa_unaware_gbps)
    # overlap_shared_experts: read only by Stepper.shared_after_route_s (CostModel.overlap_shared_s) in the
    # layer loop, which the driver runs as the event loop does; the kernels refuse it (kernel_refusal)
    "runtime": frozenset({"activation_copies", "cpu_kernel", "cpu_switch_us", "cuda_graphs", "demand_load_us", "eager_prefill",
                          "eager_score_bytes", "host_memory", "iteration_us", "kv_on_host", "launch_us", "layer_kernels",
                          "layer_us", "name", "numa_aware", "overlap_shared_experts", "pageable_copy_us", "prefetch_issue_us", "source",
                          "static_cache_pad_tokens", "token_us"}),
}
"""The fields of the cost model's specs the fast replays declare."""

WORKLOAD_FIELDS = frozenset({"trace", "iterations", "batches", "requests", "decode_tokens", "context_tokens",
                             "peak_kv_tokens", "_future", "_token_rows", "serving"})
"""The workload's fields the fast replays declare (the context's KV reads are in each
iteration's ``kv_tokens`` and ``attn_pairs``, which only Stepper.non_moe_s reads). ``serving``
(requests arriving over time): the driver runs the scheduler as the event loop does, through the
same Stepper (``iterations``, ``begin_iteration``: the idle GPU waits for the next arrival with
the GPU stream's ``run_for``; ``end_iteration``), on the run's clock (``RunState.now``, the
driver's ``fast_now``); ``tests/test_fastdriver_serving.py`` compares the two; the kernels
refuse it (:data:`KERNEL_WORKLOAD`)."""

KERNEL_WORKLOAD: dict[str, Check] = {
    "serving": _off("requests arrive over time (workload.arrivals): the kernels replay a fixed list of iterations"),
}
"""The workload's fields the kernels take only when off (absent, None); the driver takes them."""


def undeclared(state: RunState[Transfers]) -> str | None:
    """The first option or field of ``state``'s run that the fast replays do not declare (or
    whose value they refuse), as a reason, or None."""
    options = state.options
    for name in options:
        if name not in ENGINE_OPTIONS:
            return f"engine option {name!r} is not declared by the fast replays"
    for name, check in ENGINE_OPTIONS.items():
        why = check(options[name]) if name in options else None
        if why is not None:
            return why
    cost = state.cost
    hw = cost.hardware
    specs: dict[str, BaseModel | None] = {"model": cost.model, "hardware": hw, "hardware.costs": hw.costs,
                                          "hardware.cpu": hw.cpu, "runtime": cost.runtime}
    for where, spec in specs.items():
        if spec is None:
            continue
        extra = sorted(set(type(spec).model_fields) - SPEC_FIELDS[where])
        if extra:
            return f"{where} field {extra[0]!r} is not declared by the fast replays"
    extra = sorted({f.name for f in dataclasses.fields(state.workload)} - WORKLOAD_FIELDS)
    if extra:
        return f"workload field {extra[0]!r} is not declared by the fast replays"
    return None


def kernel_refusal(state: RunState[Transfers]) -> str | None:
    """Why no kernel can replay ``state``'s run (accepted by :func:`undeclared`), or None: one
    of :data:`KERNEL_OPTIONS` on, a serving workload (:data:`KERNEL_WORKLOAD`), shared experts run
    after routing (``runtime.overlap_shared_experts``), decision time,
    experts split into parts, a lossy policy (its plans), one global pool, or copies under way
    at the start (the kernels start from rest). (Aborted copies need no check: the kernels take
    only parts that never abort.)"""
    for name, check in KERNEL_OPTIONS.items():
        why = check(state.options[name]) if name in state.options else None
        if why is not None:
            return why
    for name, check in KERNEL_WORKLOAD.items():
        why = check(getattr(state.workload, name))
        if why is not None:
            return why
    if state.cost.runtime.overlap_shared_experts:
        return "runtime.overlap_shared_experts is on (the kernels run the shared experts before routing)"
    if state.policy.decision_us:
        return "the policy spends decision time"
    if any(len(fr) != 1 for fr in state.fractions):
        return "experts are split into parts"
    if state.policy.lossy:
        return "the policy plans (lossy)"
    if state.global_pool:
        return "the policy uses one global pool"
    if any(u.state != RESIDENT for u in state.vram.units.values()) or state.vram.draining_any():
        return "the run starts with transfers under way (the kernels start from rest)"
    return None
