"""Host-to-device copies from pageable (not pinned) host memory: the published measurements
and the catalog's rule for a GPU without a figure of its own.

A copy from pageable memory cannot be DMA'd directly: the CUDA driver first copies the bytes into
a pinned staging buffer with the host CPU, then DMAs them (NVIDIA, "How to Optimize Data Transfers
in CUDA C/C++"). Its rate is therefore bounded by the host's memcpy into the staging buffer as
well as by the link, and differs from host to host far more than the pinned rate does.

:data:`PAGEABLE_MEASUREMENTS` are the published pairs (pinned, pageable) of one host each. The
rule ``min(PAGEABLE_SHARE x pinned, PAGEABLE_CAP_GBPS)`` has two constants, set from the two rows
declared ``fit`` (the share from the PCIe 3.0 row, the cap from the PCIe 5.0 row, where the link
is far from the bound); the other rows were found later and never moved them (role ``test``):
:func:`rule_errors` gives each row's predicted / measured ratio, and the catalog's test prints
the held-out error. What they show: pageable rates of 3.3-10 GB/s on PCIe 4.0 A100 hosts (a 3x
spread between two servers with the same GPU), 12.9 GB/s on a PCIe 4.0 RTX 4090 host, 7.3-11.1
GB/s on three PCIe 5.0 hosts (two of them virtual machines), so no rule of the link alone predicts
one host within 1.5x; a hardware entry that has a measurement of its own GPU and host class uses
it (``pageable_gbps`` with its source).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class PageableMeasurement:
    """One published host-to-device measurement from pinned and from pageable memory on one host."""

    host: str            # the GPU and host as the source names them
    pcie_gen: int        # the link's PCIe generation
    pinned_gbps: float   # host-to-device GB/s from pinned memory
    pageable_gbps: float  # host-to-device GB/s from pageable memory, same host, same tool
    source: str          # where it was published, and how it was measured
    role: str            # "fit": set the rule's constants; "test": held out, never moved them


PAGEABLE_MEASUREMENTS: tuple[PageableMeasurement, ...] = (
    PageableMeasurement(
        "PCIe 3.0 x16 GPU (PyTorch issue reporter's host)", 3, 11.0, 5.1,
        "pytorch/pytorch#16901: ~5.1 GB/s from a pageable tensor against ~11 GB/s after pin_memory()", "fit"),
    PageableMeasurement(
        "H100 PCIe, PCIe 5.0 x16 virtual machine (issue 25)", 5, 54.0, 7.3,
        "measured for moesim issue 25: torch copy_ of 64 MiB-1 GiB, 7.1-7.5 GB/s pageable against 53-55 GB/s "
        "pinned (midpoints)", "fit"),
    PageableMeasurement(
        "NVIDIA DGX A100 (A100-SXM4-80GB, PCIe 4.0)", 4, 25.7, 10.0,
        "github.com/gengwg/gpu nvda_gpu_benchmark.md: CUDA samples bandwidthTest --memory=pinned / "
        "--memory=pageable --mode=quick, 32 MB transfers, host to device", "test"),
    PageableMeasurement(
        "Dell XE server, A100 80GB PCIe (PCIe 4.0)", 4, 17.3, 3.3,
        "github.com/gengwg/gpu nvda_gpu_benchmark.md: CUDA samples bandwidthTest --memory=pinned / "
        "--memory=pageable --mode=quick, 32 MB transfers, host to device", "test"),
    PageableMeasurement(
        "RAPIDS developer's GPU host, PCIe 3.0", 3, 11.5, 5.5,
        "rapidsai/dask-cuda PR #98 (2019-08-01): 'Without pinned memory, I normally see transfers at 5-6 GB/s, "
        "and 11-12 GB/s with' (midpoints)", "test"),
    PageableMeasurement(
        "H200, PCIe 5.0 x16 virtual machine (issue 32)", 5, 55.4, 8.9,
        "measured for moesim issue 32 (benchmarks/results/gpu/validate_h200_host_paths.md, "
        "benchmarks/host_paths_probe.py): blocking torch copy_ on the compute stream of a 352 MB expert 8.97 GB/s "
        "and a 2.8 GB layer 8.78 GB/s (midpoint) against 55.4 GB/s pinned", "test"),
    PageableMeasurement(
        "GeForce RTX 4090, PCIe 4.0 x16 (NVlabs/cuda-oxide developer's host; CPU not stated)", 4, 23.9, 12.88,
        "github.com/NVlabs/cuda-oxide pull request #976 (2026-08-17), example pinned_overlap: cuMemcpy host to "
        "device, median of 10 timed iterations, 64 MiB: 12.88 GB/s pageable against 23.9 GB/s pinned (the stored "
        "copy of the table ends at '23.9'); at 16 MiB the same table has 18.42 against 23.85", "test"),
    PageableMeasurement(
        "RAPIDS 'PDX cluster' node, PCIe 5.0 (GPU and CPU not stated; 52.4 GB/s pinned is beyond PCIe 4.0)", 5,
        52.45, 11.10,
        "github.com/rapidsai/rapidsmpf pull request #348 (2025-06-16), benchmark bench_memory_resources, "
        "HostToDeviceCopy of 1 GiB: 11,100.86 MB/s from rmm's new_delete (pageable) host resource against "
        "52,449.32 MB/s from its pinned one (500 MB: 11,344.72 against 52,449.99)", "test"),
)
"""Published pinned and pageable host-to-device rates, one host each (see the module docstring)."""

PAGEABLE_SHARE = 0.5
"""Pageable rate as a share of the pinned rate where the host's staging copy is not the limit:
the ``fit`` PCIe 3.0 row's 5.1 / 11 = 0.46, rounded to one figure."""

PAGEABLE_CAP_GBPS = 7.5
"""The host's staging copy rate that bounds pageable copies on fast links: the ``fit`` PCIe 5.0
row's 7.1-7.5 GB/s (its upper end)."""


def pageable_rule_gbps(pinned_gbps: float) -> float:
    """Host-to-device GB/s from pageable memory that the rule gives for a pinned rate:
    ``min(PAGEABLE_SHARE x pinned, PAGEABLE_CAP_GBPS)``."""
    return min(PAGEABLE_SHARE * pinned_gbps, PAGEABLE_CAP_GBPS)


def rule_errors(role: str | None = None) -> list[tuple[PageableMeasurement, float]]:
    """Each measurement (of ``role``, or all) with the rule's prediction over the measured
    pageable rate."""
    return [(m, pageable_rule_gbps(m.pinned_gbps) / m.pageable_gbps)
            for m in PAGEABLE_MEASUREMENTS if role is None or m.role == role]


def held_out_summary() -> str:
    """The rule's error on the rows it was not set from, in one line (median |error|, range)."""
    ratios = [r for _, r in rule_errors("test")]
    med = statistics.median(abs(r - 1.0) for r in ratios)
    return (f"pageable rule min({PAGEABLE_SHARE:g} x pinned, {PAGEABLE_CAP_GBPS:g} GB/s) on {len(ratios)} held-out "
            f"hosts: median |error| {med:.0%}, {min(ratios):.2f}-{max(ratios):.2f}x")
