"""What ``simctl advise`` says about the host side of its predictions: the host CPU in a few
words, a runtime's own CPU expert kernel (``runtime.cpu_kernel``) as a calibration line, and the
caveat for a system that reads a multi-socket host without placing its weights per NUMA node
where the host gives no ``numa_unaware_gbps`` (its prediction then reads every socket at the
full rate)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CPU_EXPERT_POLICIES = ("cpu-moe", "fiddler")
"""The advise options' policies that compute experts on the host CPU (llama.cpp, Fiddler)."""


def cpu_words(cpu: Any) -> str:
    """A host CPU in a few words: cores, memory bandwidth, compute (all sockets together)."""
    return f"{cpu.cores} cores, {cpu.sockets * cpu.mem_gbps:g} GB/s memory, {cpu.sockets * cpu.tflops:g} TFLOP/s"


def kernel_lines(rt: Any) -> list[str]:
    """A runtime's own CPU expert kernel (``cpu_kernel``) as a calibration line, or none."""
    k = rt.cpu_kernel
    if k is None:
        return []
    return [f"  its CPU expert kernel: {k.call_us:g} us a call, {k.read_share:g} of the host's read rate, "
            f"{k.compute_share:g} of its throughput: {k.source or 'no source stated'}"]


def numa_caveats(cpu: Any, systems: Iterable[tuple[str, str]], runtime_file: str | None = None) -> list[str]:
    """One line per system of ``systems`` (its name and catalog runtime; every system runs
    ``runtime_file`` when given) that computes experts on ``cpu``, a host of several sockets that
    gives no ``numa_unaware_gbps``, under a runtime that places no weights per NUMA node (not
    ``numa_aware``): its prediction reads every socket at the full rate."""
    from moesim.sim.config.catalog import get_runtime
    from moesim.sim.study.advise_inputs import runtime_file as user_runtime

    if cpu.sockets == 1 or cpu.numa_unaware_gbps is not None:
        return []
    own = get_runtime(user_runtime(runtime_file)) if runtime_file else None
    out = []
    for system, name in dict.fromkeys(systems):
        rt = own or get_runtime(name)
        if not rt.numa_aware:
            out.append(f"{system} on {cpu.sockets} sockets: its runtime {rt.name} places no weights per NUMA node, "
                       f"and host {cpu.name} gives no numa_unaware_gbps, so its experts are read at all "
                       f"{cpu.sockets} sockets' full rate ({cpu.sockets} x {cpu.mem_gbps:g} GB/s): optimistic for "
                       f"{system} (give the host's figure in a --gpu hardware file's cpu: section)")
    return out


__all__ = ["CPU_EXPERT_POLICIES", "cpu_words", "kernel_lines", "numa_caveats"]
