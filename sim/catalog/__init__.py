"""Catalogs of MoE models and GPUs, shipped as YAML beside this file.

Entries are validated :class:`ModelSpec` / :class:`HardwareSpec` objects. A scenario names an
entry, or gives a mapping ``{base: NAME, field: value, ...}`` that overrides fields of one, or
a full inline spec.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from moesim.sim.core.errors import MoesimError

GIB = 1024**3


class CatalogError(MoesimError, ValueError):
    """Unknown catalog name or invalid entry; the message is one line."""


class CatalogFieldError(CatalogError):
    """An invalid field of a model, hardware or runtime spec: ``field`` is its dotted path
    inside the spec (``costs.layer_us``) and ``problem`` what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _field_error(exc: ValidationError) -> CatalogFieldError:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(spec)"
    msg = "unknown key" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid value")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return CatalogFieldError(loc, msg + more)


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

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        return self

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


class CpuSpec(BaseModel):
    """The host CPU, for experts a plan runs on the CPU instead of loading them (Fiddler,
    llama.cpp ``--n-cpu-moe``). An expert's CPU time is a roofline over the host's memory
    bandwidth (its weights are read once per call) and vector throughput, plus a fixed cost,
    unless ``expert_us`` gives a measured figure."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cores: PositiveInt = Field(16, description="cores used for expert computation")
    mem_gbps: PositiveFloat = Field(80.0, description="effective host memory bandwidth in GB/s")
    tflops: PositiveFloat = Field(1.5, description="effective dense throughput of the cores in TFLOP/s")
    call_us: float = Field(20.0, ge=0, description="fixed cost of one expert call on the CPU")
    expert_us: float | None = Field(None, ge=0, description="measured time of one expert for one token (overrides the roofline)")
    expert_us_per_token: float = Field(0.0, ge=0, description="with expert_us: extra time per additional token")


class RuntimeSpec(BaseModel):
    """Framework overhead of the inference runtime, on the GPU stream's critical path (kernel
    launches and Python dispatch that the roofline has not): per MoE layer, per forward pass,
    per token of a forward pass, per demand load and per prefetch issued, in microseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="runtime profile name")
    layer_us: float = Field(0.0, ge=0, description="overhead per MoE layer of every forward pass")
    iteration_us: float = Field(0.0, ge=0, description="overhead per forward pass (scheduling, sampling)")
    token_us: float = Field(0.0, ge=0, description="overhead per token of a forward pass")
    demand_load_us: float = Field(0.0, ge=0, description="host-side cost of each demand load on the critical path, beyond the copy (issuing it, blocking on it, resuming the layer); paid before the load is queued")
    prefetch_issue_us: float = Field(0.0, ge=0, description="host-side cost of issuing each prefetch on the critical path, beyond the copy (the bookkeeping, handing the copy to its stream or thread, the interference of its landing); paid on the GPU stream at the next hook boundary while the copy starts at once")
    source: str = Field("", description="where the numbers come from")


class HardwareSpec(BaseModel):
    """A GPU and its host link."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="hardware name")
    vram_gib: PositiveFloat = Field(description="GPU memory in GiB")
    pcie_gbps: PositiveFloat = Field(description="effective host-to-device bandwidth in GB/s (1 GB = 1e9 bytes)")
    pcie_latency_us: float = Field(10.0, ge=0, description="fixed cost of one host-to-device transfer")
    copy_engines: PositiveInt = Field(1, description="concurrent host-to-device transfers")
    d2h_gbps: PositiveFloat | None = Field(None, description="device-to-host bandwidth in GB/s, used when cache.swap_out copies evicted experts back (default: pcie_gbps)")
    peak_tflops: PositiveFloat = Field(description="dense bf16 tensor throughput in TFLOP/s")
    hbm_gbps: PositiveFloat = Field(description="GPU memory bandwidth in GB/s")
    kernel_us: float = Field(5.0, ge=0, description="fixed launch/synchronisation overhead of one expert or layer kernel group")
    evict_us: float = Field(0.0, ge=0, description="cost of an eviction on the critical path (paid inside a demand miss)")
    costs: CostsSpec | None = Field(None, description="calibrated costs overriding the roofline")
    cpu: CpuSpec = Field(default_factory=lambda: CpuSpec.model_validate({}), description="the host CPU, for experts run on the CPU")
    source: str = Field("", description="where the entry's numbers come from (spec sheet, derivation, calibration file)")
    sources: dict[str, str] = Field(default_factory=dict, description="per-field provenance: field name -> source, "
                                    "overriding ``source`` for that field")

    def source_of(self, field_name: str) -> str:
        """Where the value of ``field_name`` comes from: its own entry in ``sources``, the
        entry's ``source`` for a field the entry sets, else the field's documented default."""
        if field_name in self.sources:
            return self.sources[field_name]
        if field_name in self.model_fields_set and self.source:
            return self.source
        return "default of HardwareSpec (not stated by the entry)"


def _load(kind: str) -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(f"{kind}.yaml").read_text()
    # libyaml's safe loader where PyYAML has it (45 ms -> 5 ms a run for the shipped catalog)
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}  # noqa: S506 - a safe loader
    return {str(k): dict(v) for k, v in data.items()}


@cache
def _raw(kind: str) -> dict[str, dict[str, Any]]:
    return _load(kind)


def _unknown(kind: str, name: str, names: list[str]) -> CatalogError:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(names))}"
    return CatalogError(f"unknown {kind} {name!r}{hint}")


def model_names() -> list[str]:
    """Names of the model catalog."""
    return sorted(_raw("models"))


def hardware_names() -> list[str]:
    """Names of the hardware catalog."""
    return sorted(_raw("hardware"))


def runtime_names() -> list[str]:
    """Names of the runtime-overhead catalog."""
    return sorted(_raw("runtime"))


def _resolve(kind: str, ref: str | dict[str, Any], cls: type[BaseModel]) -> Any:
    raw = _raw({"model": "models", "hardware": "hardware", "runtime": "runtime"}[kind])
    if isinstance(ref, str):
        if ref not in raw:
            raise _unknown(kind, ref, list(raw))
        return cls(name=ref, **raw[ref])
    if not isinstance(ref, dict):
        raise CatalogFieldError("(spec)", f"expected a catalog name or a mapping, got {type(ref).__name__}")
    data = dict(ref)
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise CatalogFieldError("base", f"expected a catalog name, got {type(base).__name__} {base!r}")
        if base not in raw:
            raise _unknown(kind, str(base), list(raw))
        merged = {"name": base, **raw[base]}
        for sub in ("costs", "cpu"):
            if isinstance(merged.get(sub), dict) and isinstance(data.get(sub), dict):
                data[sub] = {**merged[sub], **data[sub]}
        merged.update(data)
        data = merged
    try:
        return cls(**data)
    except ValidationError as exc:
        raise _field_error(exc) from None


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
    if section in data:
        data = data[section]
        if not isinstance(data, dict):
            raise CatalogError(f"{p}: {section}: must be a mapping")
    spec = {str(k): v for k, v in data.items()}
    spec.setdefault("name", p.stem)
    return spec


def is_spec_file(ref: Any) -> bool:
    """A catalog reference that names a YAML file (``*.yaml`` / ``*.yml``) rather than an entry."""
    return isinstance(ref, str) and ref.lower().endswith((".yaml", ".yml"))


def get_runtime(ref: str | dict[str, Any]) -> RuntimeSpec:
    """Resolve a runtime reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: RuntimeSpec = _resolve("runtime", ref, RuntimeSpec)
    return spec
