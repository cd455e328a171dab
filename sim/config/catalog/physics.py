"""Physical limits of the host link, written once with their source, for the catalog's test
and the bounds of ``simctl fit``.

A PCIe link carries at most its generation's theoretical rate per direction, after line
coding (PCI-SIG base specifications: 8 GT/s x 128b/130b for 3.0, 16 GT/s for 4.0, 32 GT/s for
5.0, per lane): 15.75 GB/s for 3.0 x16, 31.5 GB/s for 4.0 x16, 63 GB/s for 5.0 x16. A copy
rate above it (pinned, pageable or device-to-host) cannot be a measured rate: a fit that wants
one is absorbing a cost the model lacks.
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
