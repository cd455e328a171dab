"""The host CPU (:class:`CpuSpec`) and its catalog (``hosts.yaml``): the processor and memory
that compute experts a plan runs on the CPU (Fiddler, llama.cpp ``--cpu-moe``) and stage
pageable copies.

An expert on the CPU is a roofline over the threads that compute it: its weights are read once
from host memory at ``min(sockets x mem_gbps, t x thread_gbps)`` (all cores share the memory
channels; one thread draws only so much), its ``2 x params x tokens`` FLOPs run at ``t / cores``
of the all-core ``sockets x tflops``, plus a fixed ``call_us``. ``mem_gbps`` and ``tflops`` are
one socket's achieved rates (a host of several sockets, each reading its own NUMA copy of the
experts, gets them once per socket; under a runtime that places no weights per NUMA node, a
host that gives ``numa_unaware_gbps`` reads at that a socket: :meth:`CpuSpec.runtime_read_gbps`),
each at most that socket's theoretical figure where the entry gives it (``peak_gbps``,
``peak_tflops``; :mod:`moesim.sim.config.catalog.physics`). ``t`` is the threads given to experts
(``threads``, default every core) times the share of their time the host's other work leaves
(``1 - busy_fraction``). At decode (a few tokens per expert) the memory term dominates: an
expert's time is its bytes over the bandwidth those threads reach.

A hardware entry names its host as ``cpu: NAME`` (an entry of ``hosts.yaml``),
``cpu: {base: NAME, threads: 8}`` or a full mapping; without one it gets the generic default
below (16 cores, 80 GB/s).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from moesim.sim.config.catalog.files import raw_entries, unknown


class CpuSpec(BaseModel):
    """The host CPU and its memory, for experts run on the CPU (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field("default", description="host name (an entry of the hosts catalog, or your own)")
    cores: PositiveInt = Field(16, description="physical cores of the host")
    sockets: PositiveInt = Field(1, description="sockets whose cores and memory compute experts, each reading its "
                                 "own copy of the expert weights (NUMA): mem_gbps and tflops are per socket")
    mem_gbps: PositiveFloat = Field(80.0, description="host memory read bandwidth one socket's cores reach together, GB/s (a streaming read, not the channels' theoretical peak)")
    numa_unaware_gbps: PositiveFloat | None = Field(
        None, description="host memory read bandwidth one socket's cores reach together when the process places "
        "no weights per NUMA node (pages on whichever node touched them first, threads reading across the "
        "sockets' link), GB/s; read in place of mem_gbps under a runtime that is not numa_aware; only with "
        "sockets > 1, at most mem_gbps (None: mem_gbps for every runtime)")
    peak_gbps: PositiveFloat | None = Field(
        None, description="theoretical read rate of one socket's memory channels, GB/s (channels x 8 B x MT/s): "
        "mem_gbps is at most this")
    thread_gbps: PositiveFloat | None = Field(
        None, description="host memory read bandwidth one thread reaches, GB/s (default mem_gbps / cores: "
        "bandwidth grows with threads up to every core)")
    tflops: PositiveFloat = Field(1.5, description="dense throughput of one socket's cores together on expert weights, TFLOP/s")
    peak_tflops: PositiveFloat | None = Field(
        None, description="theoretical peak of one socket's cores for the expert kernel's instruction set at their "
        "top clock, TFLOP/s (tera-operations, a multiply-add counting 2): tflops is at most this")
    threads: PositiveInt | None = Field(None, description="threads that compute experts (default: every core)")
    busy_fraction: float = Field(0.0, ge=0, lt=1, description="share of those threads' time taken by the host's "
                                 "other work (tokenizer, server, other processes): experts get the rest")
    call_us: float = Field(20.0, ge=0, description="fixed cost of one expert call on the CPU")
    expert_us: float | None = Field(None, ge=0, description="measured time of one expert for one token at "
                                    "`threads` threads (overrides the roofline; divided by 1 - busy_fraction)")
    expert_us_per_token: float = Field(0.0, ge=0, description="with expert_us: extra time per additional token")
    expert_us_by_tokens: dict[PositiveInt, NonNegativeFloat] | None = Field(
        None, description="measured time of one expert at these token counts at `threads` threads (a calibration's "
        "rows; overrides expert_us and expert_us_per_token): linear between them, the smallest count's time below "
        "it, the last two's slope beyond the largest (for a kernel whose time is no line in tokens, e.g. a faster "
        "matrix path from a few rows)")
    source: str = Field("", description="where the entry's numbers come from")
    sources: dict[str, str] = Field(default_factory=dict, description="per-field provenance: field name -> source")

    @model_validator(mode="after")
    def _check(self) -> CpuSpec:
        if self.threads is not None and self.threads > self.cores:
            raise ValueError(f"threads ({self.threads}) exceeds cores ({self.cores})")
        if self.cores % self.sockets:
            raise ValueError(f"cores ({self.cores}) is not a whole number per socket ({self.sockets} sockets)")
        if self.numa_unaware_gbps is not None:
            if self.sockets == 1:
                raise ValueError(f"numa_unaware_gbps ({self.numa_unaware_gbps:g}) is set on a host of one socket: "
                                 "it is the rate of a process that ignores the NUMA nodes of several sockets")
            if self.numa_unaware_gbps > self.mem_gbps:
                raise ValueError(f"numa_unaware_gbps ({self.numa_unaware_gbps:g}) exceeds mem_gbps "
                                 f"({self.mem_gbps:g}): ignoring the NUMA nodes does not read faster")
        if self.peak_gbps is not None and self.mem_gbps > self.peak_gbps:
            raise ValueError(f"mem_gbps ({self.mem_gbps:g}) exceeds the socket's channels (peak_gbps "
                             f"{self.peak_gbps:g}): beyond physics")
        if self.peak_tflops is not None and self.tflops > self.peak_tflops:
            raise ValueError(f"tflops ({self.tflops:g}) exceeds the socket's cores (peak_tflops "
                             f"{self.peak_tflops:g}): beyond physics")
        return self

    def measured_expert_us(self, n_tokens: int) -> float | None:
        """One expert's measured time for ``n_tokens`` tokens, microseconds, from
        ``expert_us_by_tokens`` (interpolated, see the field) or ``expert_us`` plus
        ``expert_us_per_token`` per token beyond the first; None without a measurement (the
        roofline applies)."""
        table = self.expert_us_by_tokens
        if table:
            ks = sorted(table)
            if n_tokens <= ks[0] or len(ks) == 1:
                return table[ks[0]]
            for a, b in zip(ks, ks[1:], strict=False):
                if n_tokens <= b:
                    return table[a] + (table[b] - table[a]) * (n_tokens - a) / (b - a)
            a, b = ks[-2], ks[-1]
            return table[b] + max(0.0, (table[b] - table[a]) / (b - a)) * (n_tokens - b)
        if self.expert_us is None:
            return None
        return self.expert_us + self.expert_us_per_token * (n_tokens - 1)

    @property
    def expert_threads(self) -> float:
        """Threads' worth of time experts get: ``threads`` (or every core) x (1 - busy_fraction)."""
        return (self.threads or self.cores) * (1.0 - self.busy_fraction)

    @property
    def read_gbps(self) -> float:
        """Host memory bandwidth the expert threads reach: ``min(sockets x mem_gbps, t x thread_gbps)``."""
        return self._read_gbps(self.mem_gbps)

    def runtime_read_gbps(self, numa_aware: bool) -> float:
        """Host memory bandwidth the expert threads reach under a runtime that places the weights
        per NUMA node (``numa_aware``) or not: :attr:`read_gbps`, or with a host of several sockets
        that gives ``numa_unaware_gbps`` and a runtime that is not NUMA-aware,
        ``min(sockets x numa_unaware_gbps, t x thread_gbps)``."""
        if numa_aware or self.numa_unaware_gbps is None or self.sockets == 1:
            return self.read_gbps
        return self._read_gbps(self.numa_unaware_gbps)

    def _read_gbps(self, socket_gbps: float) -> float:
        total = self.sockets * socket_gbps
        per = self.thread_gbps if self.thread_gbps is not None else total / self.cores
        return min(total, self.expert_threads * per)

    @property
    def compute_tflops(self) -> float:
        """Dense throughput the expert threads reach: their share of the all-core ``sockets x tflops``."""
        return self.sockets * self.tflops * self.expert_threads / self.cores


def host_names() -> list[str]:
    """Names of the host CPU catalog."""
    return sorted(raw_entries("hosts"))


def cpu_fields(ref: Any) -> Any:
    """The mapping a hardware spec's ``cpu:`` stands for: a host catalog name becomes its
    entry, ``{base: NAME, ...}`` the entry with those fields changed; anything else is returned
    as given (the spec's validation judges it)."""
    hosts = raw_entries("hosts")
    if isinstance(ref, str):
        if ref not in hosts:
            raise unknown("host", ref, list(hosts))
        return {"name": ref, **hosts[ref]}
    if isinstance(ref, dict) and "base" in ref:
        data = dict(ref)
        base = data.pop("base")
        if not isinstance(base, str) or base not in hosts:
            raise unknown("host", str(base), list(hosts))
        merged = {"name": base, **hosts[base]}
        if isinstance(data.get("sources"), dict):
            data["sources"] = {**merged.get("sources", {}), **data["sources"]}
        merged.update(data)
        return merged
    return ref

