"""The host side: CPU catalog entries (every number sourced), selecting one by name, the CPU
expert roofline with its thread count and the host's other work, and pinned against pageable
copy rates."""

from __future__ import annotations

import pytest

from moesim.sim.config.catalog import (
    PAGEABLE_CAP_GBPS,
    CatalogError,
    get_cpu,
    get_hardware,
    get_model,
    hardware_names,
    host_names,
)
from moesim.sim.engine.cost import CostModel

US = 1e-6
NUMBERS = ("cores", "mem_gbps", "thread_gbps", "tflops", "call_us")


@pytest.mark.parametrize("name", host_names())
def test_every_host_number_has_a_source(name: str) -> None:
    cpu = get_cpu(name)
    assert cpu.name == name and cpu.source
    for field in NUMBERS:
        assert field in cpu.model_fields_set, f"{name} leaves {field} at the default"
        assert cpu.sources.get(field), f"{name}.{field} has no source"


def test_desktop_and_server_parts_are_there() -> None:
    names = set(host_names())
    assert {"ddr4-desktop-2ch", "ddr5-desktop-2ch", "epyc-milan-8ch", "epyc-genoa-12ch", "xeon-spr-8ch"} <= names
    # achievable bandwidth below each platform's theoretical peak (channels x 8 B x MT/s)
    peaks = {"ddr4-desktop-2ch": 2 * 8 * 3.2, "ddr5-desktop-2ch": 2 * 8 * 5.6, "epyc-milan-8ch": 8 * 8 * 3.2,
             "epyc-genoa-12ch": 12 * 8 * 4.8, "xeon-spr-8ch": 8 * 8 * 4.8}
    for name, peak in peaks.items():
        assert 0.8 * peak <= get_cpu(name).mem_gbps < peak


def test_hardware_selects_a_host_by_name_or_with_changes() -> None:
    hw = get_hardware({"base": "rtx-4090", "cpu": "ddr5-desktop-2ch"})
    assert hw.cpu == get_cpu("ddr5-desktop-2ch") and hw.vram_gib == 24
    hw = get_hardware({"base": "rtx-4090", "cpu": {"base": "epyc-genoa-12ch", "threads": 8}})
    assert hw.cpu.name == "epyc-genoa-12ch" and hw.cpu.threads == 8 and hw.cpu.mem_gbps == 392
    hw = get_hardware({"base": "a100-pcie-buddymoe", "cpu": {"busy_fraction": 0.5}})
    assert hw.cpu.mem_gbps == 80 and hw.cpu.busy_fraction == 0.5   # the base's host, one field changed
    assert get_hardware("rtx-4090").cpu == get_cpu({})   # no host named: the generic default


def test_bad_host_references_are_one_line() -> None:
    with pytest.raises(CatalogError, match="unknown host 'ddr5-destop'; did you mean 'ddr5-desktop-2ch'"):
        get_hardware({"base": "rtx-4090", "cpu": "ddr5-destop"})
    with pytest.raises(CatalogError, match=r"cpu: .*threads \(99\) exceeds cores \(8\)"):
        get_hardware({"base": "rtx-4090", "cpu": {"base": "ddr5-desktop-2ch", "threads": 99}})
    with pytest.raises(CatalogError, match="cpu.busy_fraction"):
        get_hardware({"base": "rtx-4090", "cpu": {"busy_fraction": 1.0}})


def _cost(cpu: object, model: object = None) -> CostModel:
    m = model or get_model("mixtral-8x7b")
    return CostModel(m, get_hardware({"base": "rtx-4090", "cpu": cpu}))


def test_cpu_expert_is_bandwidth_bound_at_decode_and_scales_with_threads() -> None:
    c = _cost("ddr5-desktop-2ch")
    nbytes = c.model.expert_bytes   # 352 MB: a bf16 Mixtral expert
    # 8 threads x 20 GB/s exceed the 76 GB/s the memory gives: the memory bounds it
    assert c.cpu_expert_s(1) == pytest.approx(nbytes / 76e9 + 20 * US)
    # two threads draw 2 x 20 GB/s
    assert _cost({"base": "ddr5-desktop-2ch", "threads": 2}).cpu_expert_s(1) == pytest.approx(nbytes / 40e9 + 20 * US)
    # the host's other work takes half of two threads: one thread's worth is left
    busy = _cost({"base": "ddr5-desktop-2ch", "threads": 2, "busy_fraction": 0.5})
    assert busy.cpu_expert_s(1) == pytest.approx(nbytes / 20e9 + 20 * US)
    # many tokens: compute-bound at the threads' share of the all-core throughput
    n = 4096
    flops = 2.0 * c.model.expert_params * n
    assert flops / 0.6e12 > nbytes / 76e9
    assert c.cpu_expert_s(n) == pytest.approx(flops / 0.6e12 + 20 * US)
    assert _cost({"base": "ddr5-desktop-2ch", "threads": 4}).cpu_expert_s(n) == pytest.approx(flops / 0.3e12 + 20 * US)


def test_measured_cpu_expert_time_is_shared_with_other_work() -> None:
    c = _cost({"expert_us": 400.0, "expert_us_per_token": 10.0, "busy_fraction": 0.2})
    assert c.cpu_expert_s(3) == pytest.approx((400 + 20) / 0.8 * US)


def test_a_measured_table_of_expert_times_is_interpolated() -> None:
    """``expert_us_by_tokens`` (a calibration's rows, no line in tokens: a faster matrix path
    from 4 rows) overrides the line: linear between rows, the first row's time below it, the
    last two rows' slope beyond (never falling), shared with other work like expert_us."""
    table = {1: 9000.0, 2: 8000.0, 4: 5000.0, 32: 6400.0}
    c = _cost({"expert_us": 1.0, "expert_us_per_token": 1.0, "expert_us_by_tokens": table, "busy_fraction": 0.5})
    got = [c.cpu_expert_s(n) / US * 0.5 for n in (1, 2, 3, 4, 18, 32, 64)]
    assert got == pytest.approx([9000, 8000, 6500, 5000, 5700, 6400, 6400 + 1400 / 28 * 32])
    flat = _cost({"expert_us_by_tokens": {4: 100.0, 8: 80.0}})
    assert [flat.cpu_expert_s(n) / US for n in (1, 6, 16)] == pytest.approx([100, 90, 80])
    assert _cost({"expert_us_by_tokens": {2: 50.0}}).cpu_expert_s(9) == pytest.approx(50 * US)


def test_pinned_and_pageable_copy_rates_apart() -> None:
    for name in hardware_names():
        hw = get_hardware(name)
        assert hw.pageable_gbps is not None and hw.sources.get("pageable_gbps"), name
        assert hw.pageable_gbps < hw.pcie_gbps
    # without a figure of its own: half the pinned rate, at most the staging cap
    assert get_hardware({"base": "t4", "pageable_gbps": None}).pageable_rate_gbps == 6.25
    assert get_hardware({"base": "h100-pcie", "pageable_gbps": None}).pageable_rate_gbps == PAGEABLE_CAP_GBPS
    model = get_model("mixtral-8x7b")
    hw = get_hardware({"base": "h100-pcie", "pageable_gbps": 7.2})
    pinned, pageable = CostModel(model, hw), CostModel(model, hw, host_memory="pageable")
    assert pinned.transfer_s(50e9) == pytest.approx(10 * US + 1.0)
    assert pageable.transfer_s(7.2e9) == pytest.approx(10 * US + 1.0)
    with pytest.raises(ValueError, match="host_memory"):
        CostModel(model, hw, host_memory="mapped")
