"""The serving keys of a scenario: when requests arrive (``workload.arrivals``), how a batch is
formed from them (``workload.scheduler``) and the latency targets goodput counts against
(``slo``), each a validated pydantic model. Without ``workload.arrivals`` a run replays the
fixed lockstep batches of :mod:`moesim.sim.engine.workload` as before."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator


class ArrivalsSpec(BaseModel):
    """When requests arrive: a Poisson process of ``rate`` requests per second (seeded by the
    scenario's ``seed``), or the arrival times and lengths of a request log (``file``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate: float | None = Field(None, gt=0, description="mean arrivals per second (Poisson, seeded by the scenario's seed)")
    file: str | None = Field(
        None, description="a CSV or Parquet request log (relative to the scenario file) with columns arrival_s, "
        "prompt_tokens and output_tokens, one row per request")
    requests: PositiveInt | None = Field(
        None, description="with rate: how many requests arrive (default: one per trace request replayed); "
        "request i replays trace request i modulo their number")

    @model_validator(mode="after")
    def _one_source(self) -> ArrivalsSpec:
        if (self.rate is None) == (self.file is None):
            raise ValueError("give exactly one of rate: R (requests per second) or file: PATH (a request log)")
        if self.file is not None and self.requests is not None:
            raise ValueError("requests: N goes with rate: the file's rows are the requests")
        return self


class SchedulerSpec(BaseModel):
    """How the GPU forms its batches from the requests that have arrived: ``static`` runs a
    batch of up to ``max_batch`` requests to its end before admitting others; ``continuous``
    (vLLM-style iteration-level scheduling) admits requests at every iteration boundary, up to
    ``max_batch`` running and ``max_tokens`` tokens an iteration, chunking prompts to fit."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["static", "continuous"] = Field("continuous", description="static or continuous batching")
    max_batch: PositiveInt = Field(8, description="requests running at once")
    max_tokens: PositiveInt = Field(
        2048, description="continuous: tokens one iteration runs (decode tokens first, then prompt chunks); "
        "at least max_batch, so that every running request decodes each iteration")

    @model_validator(mode="after")
    def _room_for_decodes(self) -> SchedulerSpec:
        if self.kind == "continuous" and self.max_tokens < self.max_batch:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be at least max_batch ({self.max_batch}): "
                             "every running request decodes one token an iteration")
        return self


class SloSpec(BaseModel):
    """Latency targets: a request meets the SLO when its time to first token and its time per
    output token are both within them (a missing target is not checked)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ttft_ms: float | None = Field(None, gt=0, description="time to first token target, ms (from arrival)")
    tpot_ms: float | None = Field(None, gt=0, description="time per output token target, ms (the request's mean)")

    @model_validator(mode="after")
    def _something(self) -> SloSpec:
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("give ttft_ms, tpot_ms or both")
        return self
