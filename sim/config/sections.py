"""The sections of a scenario other than its catalog references: the expert budget (``cache``),
the copy lanes (``pcie``), the profiling split (``profile``), the policy (``policy``) and the
replayed workload (``workload``), each a validated pydantic model that
:class:`~moesim.sim.config.scenario.Scenario` holds."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from moesim.sim.config.catalog import GIB, ModelSpec
from moesim.sim.config.serving_spec import ArrivalsSpec, SchedulerSpec


class CacheSpec(BaseModel):
    """The expert budget: exactly one of ``rate``, ``experts_per_layer`` or ``gib``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate: float | None = Field(None, gt=0, le=1, description="budget as a fraction of all routed-expert bytes, in (0, 1]")
    experts_per_layer: float | None = Field(None, gt=0, description="budget in whole experts per MoE layer")
    gib: float | None = Field(None, gt=0, description="budget in GiB")
    initial: Literal["empty", "popular", "random"] = Field(
        "empty", description="cache content at time 0: empty, the most popular experts of each layer "
        "(from an offline profile of the replayed trace), or random experts")
    buffer_experts: float = Field(0, ge=0, description="extra room for transfers in flight, in experts, "
                                  "given equally to every policy (MoEpic's comparison uses top_k)")
    scope: Literal["layer", "global"] | None = Field(
        None, description="pool layout: one pool per MoE layer, or one global pool shared by all layers; "
        "default: the policy's own (fmoe global, the others per layer), so that comparisons can give "
        "every system the same layout")
    swap_out: bool = Field(False, description="evicting copies the expert back to the host over the D2H lane "
                           "(hardware.d2h_gbps) and frees its room only when that copy lands; default false: "
                           "weights are read-only and the host keeps them, so eviction just drops the copy")
    serial_swap: bool | None = Field(
        None, description="with swap_out: demand misses swap one at a time (evict-then-fetch): the "
        "eviction for the next waiting demand load starts only when the previous demand load has "
        "landed, so no copy-back overlaps a demand load (the on-demand baseline of ActiveEvict, "
        "Fig. 3(a), whose blocking I/O equals its total I/O in Table 3); default: swaps pipeline, "
        "the next copy-back runs beside the previous load")

    @field_validator("rate", "experts_per_layer", "gib", "buffer_experts", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"expected a number, got {str(v).lower()}")
        return v

    @property
    def given(self) -> str:
        """The key that sets the budget: ``rate``, ``experts_per_layer`` or ``gib``."""
        return next(k for k in ("rate", "experts_per_layer", "gib") if getattr(self, k) is not None)

    @model_validator(mode="after")
    def _exactly_one(self) -> CacheSpec:
        given = [k for k in ("rate", "experts_per_layer", "gib") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of rate, experts_per_layer, gib (got {', '.join(given) or 'none'})")
        if self.serial_swap and not self.swap_out:
            raise ValueError("serial_swap needs swap_out: true (without copy-backs there is nothing to serialise)")
        return self

    def budget_bytes(self, model: ModelSpec) -> int:
        if self.rate is not None:
            return int(self.rate * model.routed_bytes)
        if self.experts_per_layer is not None:
            return int(round(self.experts_per_layer * model.num_layers)) * model.expert_bytes
        assert self.gib is not None
        return int(self.gib * GIB)


class PcieSpec(BaseModel):
    """Copy-queue discipline of the host-to-device lanes."""

    model_config = ConfigDict(extra="forbid")

    order: Literal["priority", "fifo"] = Field(
        "priority", description="priority: demand loads jump queued prefetches, which may be withdrawn; "
        "fifo: one copy stream, issued copies are never reordered or withdrawn (CUDA stream order)")
    sync_prefetch: bool = Field(
        False, description="the GPU waits for every prefetch issued so far before each layer "
        "(the synchronous prediction-and-prefetch of some baselines)")


class ProfileSpec(BaseModel):
    """The profiling split: requests given to policies at set-up for offline statistics and never
    measured. ``requests: N`` alone takes the first N requests of the scenario's trace (and the
    workload replays the others); with ``trace``, the first N (or all) requests of that file."""

    model_config = ConfigDict(extra="forbid")

    requests: PositiveInt | None = Field(None, description="how many requests (from the start) form the profile")
    trace: str | None = Field(None, description="another trace file (relative to the scenario file)")

    @model_validator(mode="after")
    def _something(self) -> ProfileSpec:
        if self.requests is None and self.trace is None:
            raise ValueError("give requests: N (the first N requests of the trace) or trace: FILE")
        return self


class PolicySpec(BaseModel):
    """A policy by registry name, with its keyword parameters."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="registered policy name (see `simctl policies`)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword parameters of the policy")


Phase = Literal["prefill", "decode"]


def _decode_only() -> list[Phase]:
    return ["decode"]


class WorkloadSpec(BaseModel):
    """Which part of the trace replays, and how it is batched."""

    model_config = ConfigDict(extra="forbid")

    batch_size: PositiveInt = Field(1, description="requests decoded together")
    phases: list[Phase] = Field(
        default_factory=_decode_only, min_length=1, description="which phases of the trace to replay")
    requests: Literal["all"] | PositiveInt | list[int] = Field(
        "all", description="all requests, the first N, or a list of request ids (each once)")
    context_tokens: int = Field(
        0, ge=0, exclude_if=lambda v: v == 0,
        description="tokens already in each request's context when the replay starts (a long chat, a RAG "
        "prompt); it grows by every token replayed. Attention then reads the KV cache (a cost per layer, "
        "docs/contract.md) and the batch's KV cache at its peak takes VRAM before the experts. 0 in a batch run: "
        "the context is not modelled (no KV cost, no KV in VRAM: the behaviour of runs without the key); a "
        "serving run (arrivals) always models its requests' own KV cache, from 0 too")
    arrivals: ArrivalsSpec | None = Field(
        None, description="serving: requests arrive over time ({rate: R} or {file: PATH}) and join the GPU's "
        "batches as workload.scheduler says; absent: the fixed lockstep batches of batch_size")
    scheduler: SchedulerSpec | None = Field(
        None, description="serving: how batches form from the requests that arrived (with arrivals; default "
        "{kind: continuous, max_batch: 8, max_tokens: 2048})")

    @model_validator(mode="after")
    def _serving_keys(self) -> WorkloadSpec:
        if self.arrivals is None and self.scheduler is not None:
            raise ValueError("scheduler goes with arrivals: without them the batches are batch_size requests in lockstep")
        if self.arrivals is not None and self.batch_size != 1:
            raise ValueError("batch_size goes without arrivals: with them scheduler.max_batch sets the batch")
        return self

    @field_validator("phases")
    @classmethod
    def _phases_once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a phase is listed twice")
        return v

    @field_validator("requests")
    @classmethod
    def _requests_once(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list selects nothing (give all, N or request ids)")
            twice = sorted({r for r in v if v.count(r) > 1})
            if twice:
                raise ValueError(f"request {twice[0]} is listed twice")
        return v
