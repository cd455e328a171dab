"""The catalog's pageable-copy rule and its published measurements
(:mod:`moesim.sim.config.catalog.pageable`): the constants come from the rows declared ``fit``,
the held-out rows are judged and never move them, every row is physical."""

from __future__ import annotations

import pytest

from moesim.sim.config.catalog import get_hardware
from moesim.sim.config.catalog.pageable import (
    PAGEABLE_CAP_GBPS,
    PAGEABLE_MEASUREMENTS,
    PAGEABLE_SHARE,
    held_out_summary,
    pageable_rule_gbps,
    rule_errors,
)
from moesim.sim.config.catalog.physics import link_limit_gbps


def test_rows_are_physical_and_declared() -> None:
    for m in PAGEABLE_MEASUREMENTS:
        assert m.role in ("fit", "test") and m.source
        assert 0 < m.pageable_gbps < m.pinned_gbps <= link_limit_gbps(m.pcie_gen), m.host
    assert {m.role for m in PAGEABLE_MEASUREMENTS} == {"fit", "test"}


def test_constants_come_from_the_fit_rows() -> None:
    fit = {m.pcie_gen: m for m in PAGEABLE_MEASUREMENTS if m.role == "fit"}
    assert round(fit[3].pageable_gbps / fit[3].pinned_gbps, 1) == PAGEABLE_SHARE
    assert fit[5].pageable_gbps <= PAGEABLE_CAP_GBPS <= fit[5].pageable_gbps * 1.05
    for _, ratio in rule_errors("fit"):
        assert ratio == pytest.approx(1.0, abs=0.1)


def test_held_out_error_as_stated() -> None:
    ratios = sorted(round(r, 2) for _, r in rule_errors("test"))
    # RTX 4090 (cuda-oxide #976), PCIe 5.0 PDX node (rapidsmpf #348), DGX A100, H200 VM (issue 32),
    # dask-cuda host, Dell A100 PCIe
    assert ratios == [0.58, 0.68, 0.75, 0.84, 1.05, 2.27]
    assert held_out_summary().endswith("median |error| 29%, 0.58-2.27x")


def test_rule_and_entry_measurement() -> None:
    assert pageable_rule_gbps(3.0) == 1.5 and pageable_rule_gbps(54.0) == PAGEABLE_CAP_GBPS
    dgx = next(m for m in PAGEABLE_MEASUREMENTS if "DGX A100" in m.host)
    hw = get_hardware("a100-sxm-80gb")
    assert hw.pageable_rate_gbps == dgx.pageable_gbps and "DGX A100" in hw.sources["pageable_gbps"]
    assert get_hardware({"base": "a100-sxm-80gb", "pageable_gbps": None}).pageable_rate_gbps == PAGEABLE_CAP_GBPS
