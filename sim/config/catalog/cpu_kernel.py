"""The CPU expert kernel a runtime runs (:class:`CpuKernelSpec`, ``runtime.cpu_kernel``): what
the runtime's own code makes of the host, as opposed to what the host is.

A host entry (:mod:`moesim.sim.config.catalog.host`) gives the rates a tuned expert kernel
reaches on that CPU (a socket's read rate, its throughput) and that kernel's fixed cost a call.
A runtime whose experts run through a slower kernel (PyTorch eager's matrix products at one row,
as Fiddler runs them) says so here, once, for every host: its own fixed cost an expert call, and
the shares of the host's read rate and throughput its kernel reaches. The cost model
(``CostModel.cpu_expert_s``) applies them on the roofline path only: a host with measured expert
times (a calibration profile) keeps them, since they already are the real kernel's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CpuKernelSpec(BaseModel):
    """The runtime's CPU expert kernel, relative to the tuned kernel a host entry's rates are
    (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    call_us: float = Field(ge=0, description="fixed cost of one expert call through this kernel, microseconds: "
                           "replaces the host's call_us")
    read_share: float = Field(gt=0, le=1, description="share of the host's expert read rate (CpuSpec.read_gbps) this "
                              "kernel reaches")
    compute_share: float = Field(gt=0, le=1, description="share of the host's expert throughput "
                                 "(CpuSpec.compute_tflops) this kernel reaches")
    source: str = Field("", description="what the kernel is and where its figures come from")
    sources: dict[str, str] = Field(default_factory=dict, description="per-field provenance: field name -> source")


__all__ = ["CpuKernelSpec"]
