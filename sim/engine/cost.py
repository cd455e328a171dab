"""Cost model: how long GPU work and PCIe transfers take (seconds).

Without calibrated ``costs`` the model is a roofline: a kernel group takes
``max(bytes_read / hbm, flops / peak) + kernel_us``. With ``hardware.costs`` (from a real GPU,
see the calibration harness) the measured per-layer and per-expert times are used instead,
with optional per-token slopes. An expert on the host CPU is the same roofline over the host's
memory and the threads that compute it (:mod:`moesim.sim.config.catalog.host`). Copies come
from pinned host memory at ``pcie_gbps``, or, for a runtime that does not pin
(``host_memory="pageable"``), at the hardware's pageable rate plus the runtime's
``pageable_copy_us`` per copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.sim.config.catalog import HardwareSpec, ModelSpec, RuntimeSpec

US = 1e-6
ACTIVATION_BYTES = 2
"""Bytes of one activation element copied between the GPU and CPU experts (16-bit hidden states)."""
NO_RUNTIME = RuntimeSpec(name="none", layer_us=0.0, iteration_us=0.0, token_us=0.0, demand_load_us=0.0,
                         prefetch_issue_us=0.0, cpu_switch_us=0.0, launch_us=0.0, layer_kernels=0, cuda_graphs=False,
                         eager_prefill=False, pageable_copy_us=0.0, host_memory=None, activation_copies=None,
                         eager_score_bytes=None, static_cache_pad_tokens=None, overlap_shared_experts=False,
                         kv_on_host=False, cpu_kernel=None, numa_aware=False, source="no overhead")


@dataclass(frozen=True)
class CostModel:
    """Durations in seconds for one model on one GPU, its host CPU and its inference runtime."""

    model: ModelSpec
    hardware: HardwareSpec
    runtime: RuntimeSpec = NO_RUNTIME
    host_memory: str = "pinned"   # where copies come from: "pinned" or "pageable" host memory

    def __post_init__(self) -> None:
        if self.host_memory not in ("pinned", "pageable"):
            raise ValueError(f"host_memory must be 'pinned' or 'pageable', got {self.host_memory!r}")

    @property
    def expert_bytes(self) -> int:
        return self.model.expert_bytes

    @property
    def h2d_gbps(self) -> float:
        """Host-to-device GB/s of this run's copies: pinned (``pcie_gbps``) or pageable."""
        hw = self.hardware
        return hw.pcie_gbps if self.host_memory == "pinned" else hw.pageable_rate_gbps

    def transfer_s(self, nbytes: float) -> float:
        """Host-to-device copy of ``nbytes``: fixed latency plus bytes over bandwidth (pinned
        or pageable, as ``host_memory`` says); a copy from pageable memory adds the runtime's
        ``pageable_copy_us`` (a synchronous copy's host work: the lane stays held while the host
        prepares and waits on it; the only policies that copy from pageable memory wait for
        their copies anyway, so lane time and host time are the same here)."""
        fixed = self.hardware.pcie_latency_us
        if self.host_memory == "pageable":
            fixed += self.runtime.pageable_copy_us
        return fixed * US + nbytes / (self.h2d_gbps * 1e9)

    def d2h_transfer_s(self, nbytes: float) -> float:
        """Device-to-host copy of ``nbytes`` (a swap-out): the same fixed latency, bytes over
        ``d2h_gbps`` (the host-to-device figure when the hardware gives none: PCIe is symmetric)."""
        hw = self.hardware
        return hw.pcie_latency_us * US + nbytes / ((hw.d2h_gbps or hw.pcie_gbps) * 1e9)

    def _roofline(self, nbytes: float, flops: float) -> float:
        hw = self.hardware
        return max(nbytes / (hw.hbm_gbps * 1e9), flops / (hw.peak_tflops * 1e12)) + hw.kernel_us * US

    def layer_s(self, n_tokens: int) -> float:
        """Non-MoE part of one layer (attention, norms, router, shared experts) for an
        iteration of ``n_tokens`` tokens. The roofline spreads ``non_expert_bytes`` evenly
        over the MoE layers (embeddings and head included)."""
        costs = self.hardware.costs
        if costs is not None:
            return (costs.layer_us + costs.layer_us_per_token * max(0, n_tokens - 1)) * US
        m = self.model
        per_layer_bytes = m.non_expert_bytes / m.num_layers
        flops = 2.0 * (per_layer_bytes / m.dtype_bytes) * n_tokens
        return self._roofline(per_layer_bytes, flops)

    def context_s(self, kv_tokens: int, attn_pairs: int) -> float:
        """Extra non-MoE time of one MoE layer for attention over a context: the iteration reads
        ``kv_tokens`` tokens of KV cache (summed over its requests) and scores ``attn_pairs``
        (query, context) pairs. ``max(read, compute)`` where read is
        ``kv_tokens x layer_us_per_context_token`` on calibrated costs that measure it, else
        ``kv_tokens x kv_bytes_per_token / kv_gbps`` (the hardware's ``kv_read_gbps``, by default
        ``hbm_gbps``), and compute is ``attn_pairs x attention_flops_per_pair / attn_tflops``
        (``attention_tflops``, by default ``peak_tflops``); both scaled by ``attention_blocks /
        num_layers`` (dense blocks' attention spread over the MoE layers, as the roofline spreads
        their weights). No fixed kernel cost: the layer's own ``layer_s`` has it. A runtime that keeps
        the KV cache on the host (``kv_on_host``) reads and computes at the host's rates instead
        (:meth:`host_attention_s`). 0 without a context."""
        if kv_tokens <= 0:
            return 0.0
        m = self.model
        hw = self.hardware
        kvb = m.kv_bytes_per_token
        flops = m.attention_flops_per_pair
        if kvb is None or flops is None:
            raise ValueError(f"model {m.name!r} gives no attention shape (attention_heads, kv_heads and head_dim, "
                             "or kv_lora_rank): its KV cache cannot be modelled")
        if self.runtime.kv_on_host:
            return self.host_attention_s(kv_tokens * kvb, attn_pairs * flops)
        slope = hw.costs.layer_us_per_context_token if hw.costs is not None else None
        read = kv_tokens * slope * US if slope is not None else kv_tokens * kvb / (hw.kv_gbps * 1e9)
        compute = attn_pairs * flops / (hw.attn_tflops * 1e12)
        return max(read, compute) * m.attention_blocks / m.num_layers

    def host_attention_s(self, kv_bytes: float, flops: float) -> float:
        """Attention over a context on the host CPU, per MoE layer, for a runtime that keeps the KV
        cache in host memory (``kv_on_host``: llama.cpp's ``-nkvo 1``): the iteration's
        ``kv_bytes`` of KV cache read at the expert threads' host rate and its ``flops`` of
        score and value products at their throughput (:meth:`host_read_gbps` and
        ``hardware.cpu``'s ``compute_tflops``), ``max(read, compute)``, scaled by
        ``attention_blocks / num_layers`` as :meth:`context_s`. The hand-off around it is
        :meth:`kv_host_switch_s`."""
        m = self.model
        cpu = self.hardware.cpu
        read = kv_bytes / (self.host_read_gbps() * 1e9)
        compute = flops / (cpu.compute_tflops * 1e12)
        return max(read, compute) * m.attention_blocks / m.num_layers

    def kv_host_switch_s(self) -> float:
        """The hand-off a runtime whose attention runs on the host (``kv_on_host``) pays around it,
        per MoE layer of every forward pass: one ``cpu_switch_us`` per attention block (the GPU
        stream synchronised, the query, key and value copied to the host, the attention's output
        copied back before the next GPU split), scaled by ``attention_blocks / num_layers`` as
        :meth:`context_s`. 0 for a runtime that keeps the KV cache on the GPU."""
        rt = self.runtime
        if not rt.kv_on_host:
            return 0.0
        m = self.model
        return rt.cpu_switch_us * US * m.attention_blocks / m.num_layers

    def eager_attention_s(self, n_tokens: int, kv_tokens: int) -> float:
        """Attention of one MoE layer for a runtime whose attention is eager (``eager_score_bytes``:
        the score matrix written to memory and passed over before the value product), for an
        iteration of ``n_tokens`` queries: each query scores ``keys`` cache slots, the context
        (``kv_tokens``, or without a modelled context the iteration's own tokens, a prompt's) and
        the ``static_cache_pad_tokens`` slots allocated beyond it, masked but computed. Time is the
        products' ``pairs x attention_flops_per_pair / attention TFLOP/s`` plus the element-wise
        passes' ``attention_heads x pairs x eager_score_bytes / hbm_gbps`` (one kernel after the
        other), scaled by ``attention_blocks / num_layers`` as :meth:`context_s`. The iteration's
        queries are taken as one sequence (exact for one request). 0 without eager attention."""
        rt = self.runtime
        if rt.eager_score_bytes is None or n_tokens <= 0:
            return 0.0
        m = self.model
        hw = self.hardware
        flops = m.attention_flops_per_pair
        if flops is None or m.attention_heads is None:
            raise ValueError(f"model {m.name!r} gives no attention shape (attention_heads with head_dim or "
                             "kv_lora_rank): its eager attention cannot be modelled")
        keys = (kv_tokens if kv_tokens > 0 else n_tokens) + (rt.static_cache_pad_tokens or 0)
        pairs = n_tokens * keys
        compute = pairs * flops / (hw.attn_tflops * 1e12)
        passes = m.attention_heads * pairs * rt.eager_score_bytes / (hw.hbm_gbps * 1e9)
        return (compute + passes) * m.attention_blocks / m.num_layers

    def activation_copy_s(self, n_tokens: int) -> float:
        """The bytes of a CPU-expert layer's activation copies for ``n_tokens`` tokens (runtime
        ``activation_copies``): ``n_tokens x hidden_size x 2`` bytes to the host and as many back,
        at ``d2h_gbps`` and ``pcie_gbps`` (pinned) or the hardware's pageable rate both ways
        (pageable); their fixed cost is in ``cpu_switch_us``. 0 when the runtime does not model them."""
        how = self.runtime.activation_copies
        if how is None or n_tokens <= 0:
            return 0.0
        hw = self.hardware
        nbytes = n_tokens * self.model.hidden_size * ACTIVATION_BYTES
        if how == "pageable":
            return 2.0 * nbytes / (hw.pageable_rate_gbps * 1e9)
        return nbytes / ((hw.d2h_gbps or hw.pcie_gbps) * 1e9) + nbytes / (hw.pcie_gbps * 1e9)

    def expert_s(self, n_tokens: int) -> float:
        """One routed expert applied to ``n_tokens`` tokens."""
        if n_tokens <= 0:
            return 0.0
        costs = self.hardware.costs
        if costs is not None:
            return (costs.expert_us + costs.expert_us_per_token * (n_tokens - 1)) * US
        m = self.model
        return self._roofline(m.expert_bytes, 2.0 * m.expert_params * n_tokens)

    def host_read_gbps(self) -> float:
        """GB/s the host's expert threads read its memory at under this runtime:
        ``hardware.cpu``'s ``read_gbps``, or, for a runtime that is not ``numa_aware`` on a host
        of several sockets that gives ``numa_unaware_gbps``, the rate at that figure a socket
        (:meth:`CpuSpec.runtime_read_gbps`)."""
        return self.hardware.cpu.runtime_read_gbps(self.runtime.numa_aware)

    def cpu_expert_s(self, n_tokens: int) -> float:
        """One routed expert applied to ``n_tokens`` tokens on the host CPU: a roofline over the
        bandwidth and throughput the expert threads reach (weights read once; see
        :class:`~moesim.sim.config.catalog.host.CpuSpec`; the read rate :meth:`host_read_gbps`),
        plus a fixed call cost, unless the host's measured times give a figure
        (``expert_us_by_tokens`` or ``expert_us``: :meth:`CpuSpec.measured_expert_us`, scaled by
        the share of time the host's other work leaves). A runtime with its own CPU expert kernel
        (``runtime.cpu_kernel``) pays its ``call_us`` in place of the host's and reaches its
        ``read_share`` and ``compute_share`` of the host's rates, on the roofline only (measured
        times are the real kernel's already)."""
        if n_tokens <= 0:
            return 0.0
        cpu = self.hardware.cpu
        measured = cpu.measured_expert_us(n_tokens)
        if measured is not None:
            return measured * US / (1.0 - cpu.busy_fraction)
        m = self.model
        read_gbps, tflops, call_us = self.host_read_gbps(), cpu.compute_tflops, cpu.call_us
        kernel = self.runtime.cpu_kernel
        if kernel is not None:
            read_gbps, tflops, call_us = read_gbps * kernel.read_share, tflops * kernel.compute_share, kernel.call_us
        return max(m.expert_bytes / (read_gbps * 1e9),
                   2.0 * m.expert_params * n_tokens / (tflops * 1e12)) + call_us * US

    def overhead_layer_s(self, prefill: bool = False) -> float:
        """The runtime's framework overhead per MoE layer of a forward pass (a prefill's when
        ``prefill``): its fixed ``layer_us`` and, for an eager pass, the launches of the
        layer's kernels (``layer_kernels x launch_us``; see :meth:`launch_layer_us`)."""
        rt = self.runtime
        return (rt.layer_us + self.launch_layer_us(prefill)) * US

    def launch_layer_us(self, prefill: bool = False) -> float:
        """Microseconds one eager MoE layer spends launching its kernels outside the experts:
        ``layer_kernels x launch_us``, 0 when the runtime replays captured graphs, unless the
        pass is a prefill (``prefill``) of a runtime that captures decode only
        (``eager_prefill``): :meth:`RuntimeSpec.launch_layer_us`."""
        return self.runtime.launch_layer_us(prefill)

    def shared_experts_s(self, n_tokens: int) -> float:
        """The shared experts' part of :meth:`layer_s` for ``n_tokens`` tokens: their roofline
        on this GPU, ``max(bytes / hbm_gbps, 2 x params x n_tokens / peak_tflops)`` with
        ``3 x hidden_size x shared_intermediate`` parameters at the model's ``dtype_bytes`` (no
        kernel cost of its own: the layer's is in :meth:`layer_s`), at most :meth:`layer_s`
        (calibrated costs measure the layer whole; the roofline's figure is taken out of it).
        0 for a model without shared experts."""
        m = self.model
        params = 3 * m.hidden_size * m.shared_intermediate
        if params == 0 or n_tokens <= 0:
            return 0.0
        hw = self.hardware
        own = max(params * m.dtype_bytes / (hw.hbm_gbps * 1e9), 2.0 * params * n_tokens / (hw.peak_tflops * 1e12))
        return min(own, self.layer_s(n_tokens))

    def overlap_shared_s(self, n_tokens: int, prefill: bool = False) -> float:
        """Seconds of a layer's shared experts that run beside its CPU experts, after routing,
        in a pass of ``n_tokens`` tokens (a prefill's when ``prefill``): :meth:`shared_experts_s`
        when the runtime overlaps them (``overlap_shared_experts``), the pass replays captured
        graphs (``cuda_graphs``, and not a prefill of an ``eager_prefill`` runtime) and has one
        token; else 0 (the shared experts run before routing, in :meth:`layer_s`)."""
        rt = self.runtime
        if not (rt.overlap_shared_experts and rt.cuda_graphs) or n_tokens != 1 or (prefill and rt.eager_prefill):
            return 0.0
        return self.shared_experts_s(1)

    def cpu_switch_s(self, n_tokens: int = 1) -> float:
        """The runtime's hand-off between the GPU and the CPU experts, once per MoE layer that
        computes experts on the CPU, in an iteration of ``n_tokens`` tokens: its fixed
        :attr:`RuntimeSpec.cpu_switch_us` and the bytes of the activation copies
        (:meth:`activation_copy_s`, when the runtime models them)."""
        return self.runtime.cpu_switch_us * US + self.activation_copy_s(n_tokens)

    def demand_load_s(self) -> float:
        """The runtime's host-side cost of one demand load on the critical path (beyond the
        copy): issuing the load, blocking on it and resuming the layer."""
        return self.runtime.demand_load_us * US

    def prefetch_issue_s(self) -> float:
        """The runtime's host-side cost of issuing one prefetch (beyond the copy), charged on
        the GPU stream at the next hook boundary."""
        return self.runtime.prefetch_issue_us * US

    def overhead_iteration_s(self, n_tokens: int) -> float:
        """The runtime's framework overhead per forward pass of ``n_tokens`` tokens."""
        rt = self.runtime
        return (rt.iteration_us + rt.token_us * n_tokens) * US

    def head_s(self, n_tokens: int) -> float:
        """Once per iteration after the last layer (LM head, sampling). The roofline folds the
        head into ``layer_s``; only calibrated costs carry a separate figure."""
        costs = self.hardware.costs
        return costs.head_us * US if costs is not None else 0.0
