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
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from moesim.sim.errors import MoesimError

GIB = 1024**3


class CatalogError(MoesimError, ValueError):
    """Unknown catalog name or invalid entry; the message is one line."""


class ModelSpec(BaseModel):
    """Shape and sizes of an MoE model (routed experts only in ``num_layers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer_us: float = Field(ge=0, description="non-MoE part of one layer (attention, norms, router), one token")
    expert_us: float = Field(ge=0, description="one routed expert applied to one token")
    layer_us_per_token: float = Field(0.0, ge=0, description="extra non-MoE time per additional token in the iteration")
    expert_us_per_token: float = Field(0.0, ge=0, description="extra expert time per additional token routed to it")
    head_us: float = Field(0.0, ge=0, description="LM head and sampling once per iteration")


class HardwareSpec(BaseModel):
    """A GPU and its host link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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


def _load(kind: str) -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(f"{kind}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    return {str(k): dict(v) for k, v in data.items()}


@cache
def _raw(kind: str) -> dict[str, dict[str, Any]]:
    return _load(kind)


def _unknown(kind: str, name: str, names: list[str]) -> CatalogError:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(names))}"
    return CatalogError(f"unknown {kind} {name!r}{hint}")


def model_names() -> list[str]:
    return sorted(_raw("models"))


def hardware_names() -> list[str]:
    return sorted(_raw("hardware"))


def _resolve(kind: str, ref: str | dict[str, Any], cls: type[BaseModel]) -> Any:
    raw = _raw("models" if kind == "model" else "hardware")
    if isinstance(ref, str):
        if ref not in raw:
            raise _unknown(kind, ref, list(raw))
        return cls(name=ref, **raw[ref])
    data = dict(ref)
    base = data.pop("base", None)
    if base is not None:
        if base not in raw:
            raise _unknown(kind, str(base), list(raw))
        merged = {"name": base, **raw[base]}
        if isinstance(merged.get("costs"), dict) and isinstance(data.get("costs"), dict):
            data["costs"] = {**merged["costs"], **data["costs"]}
        merged.update(data)
        data = merged
    return cls(**data)


def get_model(ref: str | dict[str, Any]) -> ModelSpec:
    """Resolve a model reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: ModelSpec = _resolve("model", ref, ModelSpec)
    return spec


def get_hardware(ref: str | dict[str, Any]) -> HardwareSpec:
    """Resolve a hardware reference: a catalog name, ``{base: NAME, ...overrides}`` or a full spec."""
    spec: HardwareSpec = _resolve("hardware", ref, HardwareSpec)
    return spec
