"""Physical limits of the host link, the host memory and the host cores, written once with their
source, for the catalog's test and the bounds of ``simctl fit``.

A PCIe link carries at most its generation's theoretical rate per direction, after line
coding (PCI-SIG base specifications: 8 GT/s x 128b/130b for 3.0, 16 GT/s for 4.0, 32 GT/s for
5.0, per lane): 15.75 GB/s for 3.0 x16, 31.5 GB/s for 4.0 x16, 63 GB/s for 5.0 x16. A copy
rate above it (pinned, pageable or device-to-host) cannot be a measured rate: a fit that wants
one is absorbing a cost the model lacks.

A host socket's memory reads at most its channels' theoretical rate (:func:`dram_gbps`), and
its cores compute at most their peak for the expert kernel's instruction set at their top
clock (:func:`cpu_peak_tflops`): the bounds of a host's achieved ``mem_gbps`` and ``tflops``.
"""

from __future__ import annotations

PCIE_X16_GBPS: dict[int, float] = {3: 15.75, 4: 31.5, 5: 63.0}
"""Theoretical GB/s per direction of a x16 link of each PCIe generation (1 GB = 1e9 bytes)."""

PCIE_SOURCE = ("PCI-SIG PCIe base specifications, per lane and direction after 128b/130b coding: 3.0 "
               "0.985 GB/s, 4.0 1.969 GB/s, 5.0 3.938 GB/s (x16: 15.75, 31.5, 63 GB/s)")
"""Where :data:`PCIE_X16_GBPS` comes from."""


def link_limit_gbps(gen: int, lanes: int = 16) -> float:
    """The theoretical GB/s per direction of a PCIe link of generation ``gen`` with ``lanes`` lanes."""
    if gen not in PCIE_X16_GBPS:
        raise ValueError(f"PCIe generation {gen}: known are {', '.join(str(g) for g in PCIE_X16_GBPS)}")
    return PCIE_X16_GBPS[gen] * lanes / 16


DRAM_CHANNEL_BYTES = 8
"""Bytes one DDR4/DDR5 channel moves per transfer (64 data bits; a DDR5 DIMM's two 32-bit
subchannels together), JEDEC JESD79-4 / JESD79-5."""

DRAM_SOURCE = ("JEDEC DDR4/DDR5 (JESD79-4, JESD79-5): 64 data bits per channel (DDR5: two 32-bit "
               "subchannels), so channels x 8 B x MT/s")
"""Where :func:`dram_gbps` comes from."""


def dram_gbps(channels: int, mts: float) -> float:
    """The theoretical read rate, GB/s, of ``channels`` DDR channels at ``mts`` mega-transfers
    per second (8 x DDR5-4800: 307.2 GB/s). No read, however streamed, goes faster."""
    return channels * DRAM_CHANNEL_BYTES * mts / 1000.0


OPS_PER_CYCLE: dict[str, int] = {"avx512-vnni-int8": 256, "avx512-fma-fp32": 64}
"""Peak operations (a multiply-add counts 2) per cycle per core of a core with two 512-bit
vector units (Intel server cores since Skylake-SP, Sapphire Rapids included), by the expert
kernel's instruction set: VPDPBUSD on zmm does 64 u8 x s8 multiply-adds, two a cycle (256);
VFMADD on zmm does 16 fp32 multiply-adds, two a cycle (64)."""

OPS_SOURCE = ("Intel Intrinsics Guide (VPDPBUSD zmm: 64 u8 x s8 products summed into 16 int32; VFMADD231PS "
              "zmm: 16 fp32 FMAs) and Chips and Cheese's Sapphire Rapids article (2 x 512-bit FMA a cycle)")
"""Where :data:`OPS_PER_CYCLE` comes from."""


def cpu_peak_tflops(cores: int, ghz: float, isa: str) -> float:
    """The theoretical peak, in tera-operations per second, of ``cores`` cores at ``ghz`` (their
    top clock) running the instruction set ``isa`` (a key of :data:`OPS_PER_CYCLE`)."""
    if isa not in OPS_PER_CYCLE:
        raise ValueError(f"instruction set {isa}: known are {', '.join(OPS_PER_CYCLE)}")
    return cores * OPS_PER_CYCLE[isa] * ghz / 1000.0
