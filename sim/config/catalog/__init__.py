"""Catalogs of MoE models, GPUs, host CPUs and runtimes, shipped as YAML beside this file.

Entries are validated :class:`ModelSpec` / :class:`HardwareSpec` / :class:`CpuSpec` objects. A
scenario names an entry, or gives a mapping ``{base: NAME, field: value, ...}`` that overrides
fields of one, or a full inline spec. A hardware spec's ``cpu:`` is itself such a reference
into the host catalog (:mod:`moesim.sim.config.catalog.host`).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from moesim.sim.config.catalog.cpu_kernel import CpuKernelSpec
from moesim.sim.config.catalog.files import CatalogError, raw_entries, unknown
from moesim.sim.config.catalog.host import CpuSpec, cpu_fields, host_names
from moesim.sim.config.catalog.pageable import PAGEABLE_CAP_GBPS, PAGEABLE_SHARE, pageable_rule_gbps
from moesim.sim.config.keys import fields_at

GIB = 1024**3


__all__ = ["GIB", "PAGEABLE_CAP_GBPS", "PAGEABLE_SHARE", "CatalogError", "CatalogFieldError", "CostsSpec",
           "CpuKernelSpec", "CpuSpec", "HardwareSpec", "ModelSpec", "RuntimeSpec", "get_cpu", "get_hardware", "get_model",
           "get_runtime", "hardware_names", "host_names", "is_spec_file", "load_spec_file", "model_names",
           "runtime_names"]


class CatalogFieldError(CatalogError):
    """An invalid field of a model, hardware or runtime spec: ``field`` is its dotted path
    inside the spec (``costs.layer_us``), ``problem`` what is wrong with it and, for an unknown
    key, ``suggestion`` the closest known one (its dotted path inside the spec)."""

    def __init__(self, field: str, problem: str, suggestion: str | None = None) -> None:
        super().__init__(f"{field}: {problem}" + (f"; did you mean {suggestion!r}?" if suggestion else ""))
        self.field = field
        self.problem = problem
        self.suggestion = suggestion


def _field_error(exc: ValidationError, cls: type[BaseModel]) -> CatalogFieldError:
    # a misspelt key also makes the key meant "missing": name the misspelling, with its fix
    errors = exc.errors()
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    parts = [str(x) for x in err.get("loc", ())]
    loc = ".".join(parts) or "(spec)"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    if err.get("type") != "extra_forbidden":
        return CatalogFieldError(loc, err.get("msg", "invalid value") + more)
    known = fields_at(cls, parts[:-1]) or []
    if len(parts) == 1:
        known.append("base")
    close = difflib.get_close_matches(parts[-1], known, n=1) if parts else []
    return CatalogFieldError(loc, "unknown key" + more, ".".join([*parts[:-1], close[0]]) if close else None)


class ModelSpec(BaseModel):
    """Shape and sizes of an MoE model (routed experts only in ``num_layers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="model name")
    num_layers: PositiveInt = Field(description="number of MoE layers (dense layers not counted)")
    num_experts: PositiveInt = Field(description="routed experts per MoE layer")
    top_k: PositiveInt = Field(description="experts selected per token and layer")
    num_shared_experts: int = Field(0, ge=0, description="always-on shared experts per MoE layer")
    shared_expert_intermediate_size: PositiveInt | None = Field(
        None, description="total intermediate size of the shared experts of one layer "
        "(default: num_shared_experts * expert_intermediate_size)")
    hidden_size: PositiveInt = Field(description="model hidden size")
    expert_intermediate_size: PositiveInt = Field(description="FFN intermediate size of one routed expert")
    dtype_bytes: PositiveFloat = Field(2, description="bytes per weight (2 for bf16, 1 for fp8)")
    non_expert_bytes: int = Field(0, ge=0, description="bytes of all weights that are not routed experts")
    dense_blocks: int = Field(0, ge=0, exclude=True, description=(
        "leading transformer blocks with a dense FFN before the first MoE layer (DeepSeek's "
        "first_k_dense_replace): not simulated, but counted by llama.cpp's --n-cpu-moe, which numbers "
        "blocks; `simctl advise` adds them to the count it prints. Left out of dumps (it times nothing)"))
    # attention and its KV cache (read only when workload.context_tokens > 0; left out of dumps,
    # so that the outputs of runs that do not model the context keep their bytes)
    attention_heads: PositiveInt | None = Field(None, exclude=True, description="query heads of one attention layer")
    kv_heads: PositiveInt | None = Field(None, exclude=True, description=(
        "key/value heads of one attention layer (grouped-query attention: fewer than attention_heads)"))
    head_dim: PositiveInt | None = Field(None, exclude=True, description="size of one key/value head")
    kv_lora_rank: PositiveInt | None = Field(None, exclude=True, description=(
        "multi-head latent attention (DeepSeek): size of the compressed KV latent cached per token and "
        "layer, in place of kv_heads x head_dim keys and values"))
    qk_rope_head_dim: PositiveInt | None = Field(None, exclude=True, description=(
        "multi-head latent attention: size of the rotary key part cached beside the latent"))
    kv_dtype_bytes: PositiveFloat = Field(2, exclude=True, description="bytes per cached key/value element (2 for bf16/fp16)")
    attention_source: str = Field("", exclude=True, description="where the attention fields come from")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        return self

    @property
    def kv_bytes_per_token(self) -> float | None:
        """Bytes of KV cache one token of context holds in one attention layer, or None when the
        spec gives no attention shape. Multi-head latent attention caches one latent and the
        rotary key, ``(kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes``; other attention a key
        and a value per KV head, ``2 x kv_heads x head_dim x kv_dtype_bytes`` (Mixtral:
        2 x 8 x 128 x 2 = 4 KiB)."""
        if self.kv_lora_rank is not None:
            return (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * self.kv_dtype_bytes
        if self.kv_heads is None or self.head_dim is None:
            return None
        return 2.0 * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def attention_blocks(self) -> int:
        """Transformer blocks that keep a KV cache: the MoE layers and the dense blocks before them."""
        return self.num_layers + self.dense_blocks

    @property
    def attention_flops_per_pair(self) -> float | None:
        """FLOPs of one attention layer for one (query token, context token) pair: the score and
        the weighted value, ``2 x 2 x attention_heads x head_dim``; with a latent (MLA, absorbed
        form) ``2 x attention_heads x (2 x kv_lora_rank + qk_rope_head_dim)``. None without heads."""
        if self.attention_heads is None:
            return None
        if self.kv_lora_rank is not None:
            return 2.0 * self.attention_heads * (2 * self.kv_lora_rank + (self.qk_rope_head_dim or 0))
        if self.head_dim is None:
            return None
        return 4.0 * self.attention_heads * self.head_dim

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert: gate, up and down projections."""
        return int(3 * self.hidden_size * self.expert_intermediate_size * self.dtype_bytes)

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def shared_intermediate(self) -> int:
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return self.num_shared_experts * self.expert_intermediate_size

    @property
    def routed_bytes(self) -> int:
        """Bytes of all routed experts of the model."""
        return self.expert_bytes * self.num_experts * self.num_layers


class CostsSpec(BaseModel):
    """Calibrated costs that override the roofline model (microseconds, batch 1 decode)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    layer_us: float = Field(ge=0, description="non-MoE part of one layer (attention, norms, router), one token")
    expert_us: float = Field(ge=0, description="one routed expert applied to one token")
    layer_us_per_token: float = Field(0.0, ge=0, description="extra non-MoE time per additional token in the iteration")
    expert_us_per_token: float = Field(0.0, ge=0, description="extra expert time per additional token routed to it")
    head_us: float = Field(0.0, ge=0, description="LM head and sampling once per iteration")
    layer_us_per_context_token: float | None = Field(
        None, ge=0, description="extra non-MoE time of one layer per token of KV cache the iteration's "
        "attention reads (workload.context_tokens; measured by `simctl calibrate`; default: the roofline's "
        "KV bytes over hbm_gbps)")


class RuntimeSpec(BaseModel):
    """Framework overhead of the inference runtime, on the GPU stream's critical path (kernel
    launches and Python dispatch that the roofline has not): per MoE layer (a fixed time, and
    the launches of an eager layer unless the runtime captures graphs), per forward pass, per
    token of a forward pass, per demand load and per prefetch issued, and per hand-off to CPU
    experts, in microseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="runtime profile name")
    layer_us: float = Field(0.0, ge=0, description="overhead per MoE layer of every forward pass")
    iteration_us: float = Field(0.0, ge=0, description="overhead per forward pass (scheduling, sampling)")
    token_us: float = Field(0.0, ge=0, description="overhead per token of a forward pass")
    demand_load_us: float = Field(0.0, ge=0, description="host-side cost of each demand load on the critical path, beyond the copy (issuing it, blocking on it, resuming the layer); paid before the load is queued")
    prefetch_issue_us: float = Field(0.0, ge=0, description="host-side cost of issuing each prefetch on the critical path, beyond the copy (the bookkeeping, handing the copy to its stream or thread, the interference of its landing); paid on the GPU stream at the next hook boundary while the copy starts at once")
    pageable_copy_us: float = Field(0.0, ge=0, description="host-side cost of each synchronous copy from pageable memory, beyond its bytes (the framework's per-tensor `.to(device)` calls, the driver's staging set-up, the blocking wait), for policies whose copies come from pageable memory (accelerate); it holds the copy lane, which the GPU waits for: see moesim.sim.engine.cost")
    host_memory: Literal["pinned", "pageable"] | None = Field(
        None, description="where the runtime keeps host-resident experts when the runtime, not the policy, "
        "decides it: 'pageable' for one that copies from memory it has not page-locked (an mmap of the weights "
        "file, a CPU state dict), so every expert copy is a driver-staged copy at the hardware's pageable rate "
        "plus pageable_copy_us; None: the policy's choice (pinned for every policy but accelerate's)")
    cpu_switch_us: float = Field(0.0, ge=0, description="hand-off between the GPU and the host CPU, once per MoE layer that computes experts on the CPU (sync the GPU stream, copy the layer's activations to the host and the CPU experts' output back, wake the CPU threads); paid on the CPU experts' lane before they start, so the layer waits for it")
    activation_copies: Literal["pinned", "pageable"] | None = Field(
        None, description="the per-layer copies of a CPU-expert layer's activations, by their bytes: "
        "every token's hidden state (hidden_size x 2 bytes, 16-bit) to the host and the CPU experts' output back, "
        "at the link's pinned rates (pcie_gbps, d2h_gbps) or, 'pageable', at the hardware's pageable rate both ways "
        "(a runtime that copies with tensor.cpu() and .to(device) into memory it has not page-locked); paid on the "
        "CPU experts' lane with cpu_switch_us; None: not modelled (cpu_switch_us holds a decode's small copies)")
    eager_score_bytes: PositiveFloat | None = Field(
        None, description="bytes of GPU memory traffic per attention score in the element-wise passes of a "
        "runtime that materialises the score matrix between its score and value products (eager, unfused "
        "attention: the partial scores added, scaled, masked, a softmax upcast to fp32 and cast back); with it each "
        "layer's attention scores every (query, cache slot) pair of each head, masked ones too, at "
        "pairs x the model's attention FLOPs per pair / attention TFLOP/s plus heads x pairs x eager_score_bytes / "
        "hbm_gbps, in place of context_s (see CostModel.eager_attention_s); None: fused attention (context_s with a "
        "modelled context)")
    static_cache_pad_tokens: NonNegativeInt | None = Field(
        None, description="slots of a static KV cache beyond the tokens written so far that eager "
        "attention scores and masks rather than skips (a cache allocated for the prompt and max_new_tokens and "
        "scored whole): added to each query's keys; only with eager_score_bytes (None: 0)")
    launch_us: float = Field(0.0, ge=0, description="host time to launch one kernel outside a captured graph (the framework's dispatch and the driver's launch)")
    layer_kernels: NonNegativeInt = Field(0, description="kernels one MoE layer launches outside its experts in eager mode; with launch_us, a per-layer launch cost of layer_kernels x launch_us, unless cuda_graphs")
    cuda_graphs: bool = Field(False, description="the runtime replays captured CUDA graphs for decode: no per-kernel launch cost (layer_kernels x launch_us is not paid)")
    eager_prefill: bool = Field(False, description="with cuda_graphs, the runtime captures its graphs for decode only and runs each prefill's forward pass eagerly (kTransformers' local_chat): a prefill iteration's MoE layers pay layer_kernels x launch_us, decode iterations do not; without cuda_graphs every iteration pays them already")
    overlap_shared_experts: bool = Field(False, description="with cuda_graphs, a graph-replayed pass of one token runs each layer's shared experts after routing, on the GPU while the layer's CPU experts run on the host (kTransformers' KDeepseekV3MoE under capture: the gate, the CPU experts submitted to the host's threads, the shared expert, then the wait for them); the shared experts' share of the layer's non-MoE time (CostModel.shared_experts_s) moves from before routing to beside the CPU experts; eager passes (a prefill under eager_prefill) and passes of more tokens keep them before the CPU experts")
    kv_on_host: bool = Field(False, description="the KV cache lives in host memory and attention over it runs on the host CPU (llama.cpp's -nkvo 1 / --no-kv-offload, llama_context_params.offload_kqv = false): each attention block pays one more GPU/CPU hand-off (cpu_switch_us: the query, key and value copied to the host, the attention's output back) and reads its KV cache and computes its products at the host's rates (hardware.cpu's read_gbps and compute_tflops, the expert threads') in place of kv_read_gbps and attention_tflops (see CostModel.host_attention_s); not with eager_score_bytes")
    cpu_kernel: CpuKernelSpec | None = Field(
        None, description="the CPU expert kernel this runtime runs, when it is not the tuned one the host's rates "
        "are (PyTorch eager's products, as Fiddler runs them): its own call_us an expert call in place of the "
        "host's, and the shares of the host's read rate and throughput it reaches (read_share, compute_share), "
        "on the roofline path only (a host with measured expert times keeps them); None: the host's kernel")
    numa_aware: bool = Field(False, description="the runtime places the expert weights per NUMA node, each "
                             "socket reading its own memory (kTransformers' NUMA-aware tensor parallelism): a "
                             "host of several sockets reads at sockets x mem_gbps; false: a host of several "
                             "sockets that gives numa_unaware_gbps reads at sockets x numa_unaware_gbps "
                             "(hardware.cpu, for experts and host-side attention alike)")
    source: str = Field("", description="where the numbers come from")

    def launch_layer_us(self, prefill: bool = False) -> float:
        """Microseconds one eager MoE layer spends launching its kernels outside the experts:
        ``layer_kernels x launch_us``, 0 when the runtime replays captured graphs, unless the
        pass is a prefill (``prefill``) of a runtime that captures decode only
        (``eager_prefill``). The engine's cost (``CostModel.launch_layer_us``) and the run
        summary's runtime row both read it."""
        if self.cuda_graphs and not (prefill and self.eager_prefill):
            return 0.0
        return self.layer_kernels * self.launch_us

    @model_validator(mode="after")
    def _check_kv_on_host(self) -> RuntimeSpec:
        if self.kv_on_host and self.eager_score_bytes is not None:
            raise ValueError("kv_on_host cannot be combined with eager_score_bytes: a host-side attention's "
                             "passes are not the GPU's eager ones; set one of them")
        return self


class HardwareSpec(BaseModel):
    """A GPU and its host link."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="hardware name")
    device: Literal["gpu", "cpu"] = Field("gpu", description="what runs the model: a GPU (its VRAM, host-to-device "
                                          "copies over PCIe) or the CPU (a `simctl calibrate` profile measured on "
                                          "the CPU: device memory is host memory, copies are memcpy); names the "
                                          "outputs' labels, changes no timing")
    vram_gib: PositiveFloat = Field(description="GPU memory in GiB")
    pcie_gbps: PositiveFloat = Field(description="effective host-to-device bandwidth in GB/s (1 GB = 1e9 bytes)")
    pcie_latency_us: float = Field(10.0, ge=0, description="fixed cost of one host-to-device transfer")
    copy_engines: PositiveInt = Field(1, description="concurrent host-to-device transfers")
    d2h_gbps: PositiveFloat | None = Field(None, description="device-to-host bandwidth in GB/s, used when cache.swap_out copies evicted experts back (default: pcie_gbps)")
    pageable_gbps: PositiveFloat | None = Field(
        None, description="host-to-device bandwidth in GB/s from pageable (not pinned) host memory, as "
        "accelerate's offloading copies (default: min(0.5 x pcie_gbps, 7.5); pcie_gbps is the pinned rate)")
    pcie_gen: Literal[3, 4, 5] | None = Field(
        None, description="PCIe generation of the host link as the GPU runs it (3, 4 or 5): its theoretical "
        "rate bounds every copy rate (pcie_gbps, pageable_gbps, d2h_gbps) and a fitted link")
    pcie_lanes: PositiveInt = Field(16, description="PCIe lanes of the host link")
    peak_tflops: PositiveFloat = Field(description="dense bf16 tensor throughput in TFLOP/s")
    hbm_gbps: PositiveFloat = Field(description="GPU memory bandwidth in GB/s")
    kv_read_gbps: PositiveFloat | None = Field(
        None, description="GB/s that attention's reads of the KV cache reach (workload.context_tokens): a decode "
        "kernel at a small batch reaches only part of hbm_gbps (few KV heads to spread over the GPU); at most "
        "hbm_gbps (default: hbm_gbps, the roofline)")
    attention_tflops: PositiveFloat | None = Field(
        None, description="TFLOP/s that attention's score and value products reach (the term that grows with the "
        "square of a prefill over a context: workload.context_tokens); at most peak_tflops (default: peak_tflops)")
    kernel_us: float = Field(5.0, ge=0, description="fixed launch/synchronisation overhead of one expert or layer kernel group")
    evict_us: float = Field(0.0, ge=0, description="cost of an eviction on the critical path (paid inside a demand miss)")
    costs: CostsSpec | None = Field(None, description="calibrated costs overriding the roofline")
    cpu: CpuSpec = Field(default_factory=lambda: CpuSpec.model_validate({}),
                         description="the host CPU, for experts run on the CPU: a hosts catalog name, "
                         "{base: NAME, field: value} or a full spec (default: a generic 16-core, 80 GB/s host)")
    source: str = Field("", description="where the entry's numbers come from (spec sheet, derivation, calibration file)")
    sources: dict[str, str] = Field(default_factory=dict, description="per-field provenance: field name -> source, "
                                    "overriding ``source`` for that field")

    @model_validator(mode="after")
    def _check_attention_rates(self) -> HardwareSpec:
        if self.kv_read_gbps is not None and self.kv_read_gbps > self.hbm_gbps:
            raise ValueError(f"kv_read_gbps ({self.kv_read_gbps:g}) exceeds hbm_gbps ({self.hbm_gbps:g}): a read of "
                             "the KV cache is no faster than the memory it reads")
        if self.attention_tflops is not None and self.attention_tflops > self.peak_tflops:
            raise ValueError(f"attention_tflops ({self.attention_tflops:g}) exceeds peak_tflops "
                             f"({self.peak_tflops:g}): attention computes no faster than the GPU's peak")
        return self

    @property
    def attn_tflops(self) -> float:
        """TFLOP/s of attention's products: ``attention_tflops``, or ``peak_tflops`` without one."""
        return self.peak_tflops if self.attention_tflops is None else self.attention_tflops

    @property
    def kv_gbps(self) -> float:
        """GB/s of attention's KV-cache reads: ``kv_read_gbps``, or ``hbm_gbps`` without one."""
        return self.hbm_gbps if self.kv_read_gbps is None else self.kv_read_gbps

    @property
    def pageable_rate_gbps(self) -> float:
        """Host-to-device GB/s from pageable memory: ``pageable_gbps``, or without one
        ``min(PAGEABLE_SHARE x pcie_gbps, PAGEABLE_CAP_GBPS)``, the rule of
        :mod:`~moesim.sim.config.catalog.pageable` (its published measurements and held-out error)."""
        if self.pageable_gbps is not None:
            return self.pageable_gbps
        return pageable_rule_gbps(self.pcie_gbps)

    @property
    def link_gbps(self) -> float | None:
        """The host link's theoretical GB/s per direction (``pcie_gen`` x ``pcie_lanes``, see
        :mod:`~moesim.sim.config.catalog.physics`), or None when the generation is not given."""
        from moesim.sim.config.catalog.physics import link_limit_gbps

        return None if self.pcie_gen is None else link_limit_gbps(self.pcie_gen, self.pcie_lanes)

    def source_of(self, field_name: str, where: str = "the entry") -> str:
        """Where the value of ``field_name`` comes from: its own entry in ``sources``, the
        entry's ``source`` for a field the entry sets (``where``: the entry, a file's name),
        that the entry sets it when it states no source, else the field's documented default."""
        if field_name in self.sources:
            return self.sources[field_name]
        if field_name in self.model_fields_set:
            return self.source or f"set in {where} (no source stated)"
        return f"default of HardwareSpec (not set in {where})"


def model_names() -> list[str]:
    """Names of the model catalog."""
    return sorted(raw_entries("models"))


def hardware_names() -> list[str]:
    """Names of the hardware catalog."""
    return sorted(raw_entries("hardware"))


def runtime_names() -> list[str]:
    """Names of the runtime-overhead catalog."""
    return sorted(raw_entries("runtime"))


def _resolve(kind: str, ref: str | dict[str, Any], cls: type[BaseModel]) -> Any:
    raw = raw_entries({"model": "models", "hardware": "hardware", "runtime": "runtime"}[kind])
    if isinstance(ref, str):
        if ref not in raw:
            raise unknown(kind, ref, list(raw))
        return _build(cls, {"name": ref, **raw[ref]})
    if not isinstance(ref, dict):
        raise CatalogFieldError("(spec)", f"expected a catalog name or a mapping, got {type(ref).__name__}")
    data = dict(ref)
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise CatalogFieldError("base", f"expected a catalog name, got {type(base).__name__} {base!r}")
        if base not in raw:
            raise unknown(kind, str(base), list(raw))
        merged = {"name": base, **raw[base]}
        if "cpu" in merged:
            merged["cpu"] = cpu_fields(merged["cpu"])
        if isinstance(data.get("cpu"), dict) and "base" not in data["cpu"] and isinstance(merged.get("cpu"), dict):
            data["cpu"] = {**merged["cpu"], **data["cpu"]}   # a few host fields changed
        for group in ("costs", "cpu_kernel"):   # a few fields of a group changed
            if isinstance(merged.get(group), dict) and isinstance(data.get(group), dict):
                data[group] = {**merged[group], **data[group]}
        merged.update(data)
        data = merged
    return _build(cls, data)


def _build(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    """Validate a spec's fields (a hardware spec's ``cpu:`` resolved in the host catalog)."""
    if cls is HardwareSpec and "cpu" in data:
        data = {**data, "cpu": cpu_fields(data["cpu"])}
    try:
        return cls(**data)
    except ValidationError as exc:
        raise _field_error(exc, cls) from None


def get_model(ref: str | dict[str, Any]) -> ModelSpec:
    """Resolve a model reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: ModelSpec = _resolve("model", ref, ModelSpec)
    return spec


def get_hardware(ref: str | dict[str, Any]) -> HardwareSpec:
    """Resolve a hardware reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: HardwareSpec = _resolve("hardware", ref, HardwareSpec)
    return spec


def load_spec_file(path: Any, section: str) -> dict[str, Any]:
    """Read a hardware or runtime spec from a YAML file (a calibration profile written by
    ``simctl calibrate``, a ``simctl fit`` file, or a hand-written spec). A file with a top-level ``section`` key
    (``hardware`` or ``runtime``) gives that mapping; otherwise the whole file is the spec.
    Bad input is a one-line :class:`CatalogError` naming the file."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise CatalogError(f"{p}: no such {section} profile file")
    from moesim.sim.core.yamlio import YamlError, load_yaml_file

    try:
        data = load_yaml_file(p)
    except YamlError as exc:
        raise CatalogError(str(exc)) from None
    if not isinstance(data, dict):
        raise CatalogError(f"{p}: a {section} profile must be a mapping")
    if section not in data and isinstance(data.get("fit"), dict) and "parameters" in data:
        raise CatalogError(f"{p}: this `simctl fit` file has no {section}: section (its rows do not share one "
                           f"{section}, or it fits no {section} field); give it as calibration: {p.name}")
    raw = data
    if section in data:
        data = data[section]
        if not isinstance(data, dict):
            raise CatalogError(f"{p}: {section}: must be a mapping")
    spec = {str(k): v for k, v in data.items()}
    spec.setdefault("name", p.stem)
    prov = raw.get("provenance") if isinstance(raw, dict) else None
    if section == "hardware" and isinstance(prov, dict) and prov.get("device_type") == "cpu":
        spec.setdefault("device", "cpu")     # a CPU profile written before the field existed
    return spec


def is_spec_file(ref: Any) -> bool:
    """A catalog reference that names a YAML file (``*.yaml`` / ``*.yml``) rather than an entry."""
    return isinstance(ref, str) and ref.lower().endswith((".yaml", ".yml"))


def get_cpu(ref: str | dict[str, Any]) -> CpuSpec:
    """Resolve a host reference: a hosts catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    try:
        return CpuSpec.model_validate(cpu_fields(ref))
    except ValidationError as exc:
        raise _field_error(exc, CpuSpec) from None


def get_runtime(ref: str | dict[str, Any]) -> RuntimeSpec:
    """Resolve a runtime reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: RuntimeSpec = _resolve("runtime", ref, RuntimeSpec)
    return spec
