"""The host's achieved expert rates against physics (issue 32 item 1): a socket's memory reads at
most its channels' theoretical rate and its cores compute at most their instruction set's peak
(``sim/config/catalog/physics.py``); a catalog entry or a fit beyond them is refused in one line;
the rates are per socket, so the two-socket host gets twice one socket's fitted rates (written
from the committed kTransformers fit), and the CPU expert cost reads them on an exact timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.sync_catalog_fits import FITTED, value
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import CatalogError, RuntimeSpec, get_cpu, get_hardware, host_names
from moesim.sim.config.catalog.physics import OPS_PER_CYCLE, cpu_peak_tflops, dram_gbps
from moesim.sim.study.fit_bounds import missing_cost, physical_bound
from moesim.sim.study.fit_spec import FitError, load_measurements
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def test_theoretical_rates() -> None:
    assert dram_gbps(8, 4800) == pytest.approx(307.2)          # 8 x DDR5-4800
    assert dram_gbps(2, 3200) == pytest.approx(51.2)           # 2 x DDR4-3200
    assert OPS_PER_CYCLE == {"avx512-vnni-int8": 256, "avx512-fma-fp32": 64}
    assert cpu_peak_tflops(32, 3.4, "avx512-vnni-int8") == pytest.approx(27.8528)
    assert cpu_peak_tflops(32, 2.2, "avx512-fma-fp32") == pytest.approx(4.5056)
    with pytest.raises(ValueError, match="instruction set amx-bf16: known are avx512-vnni-int8, avx512-fma-fp32"):
        cpu_peak_tflops(32, 3.4, "amx-bf16")


@pytest.mark.parametrize("name", host_names())
def test_host_rates_within_their_peaks(name: str) -> None:
    cpu = get_cpu(name)
    if cpu.peak_gbps is not None:
        assert cpu.mem_gbps <= cpu.peak_gbps and cpu.sources.get("peak_gbps", "").startswith("physics: ")
    if cpu.peak_tflops is not None:
        assert cpu.tflops <= cpu.peak_tflops and cpu.sources.get("peak_tflops", "").startswith("physics: ")


def test_the_kt_hosts_peaks_are_the_physics_figures() -> None:
    for name in ("xeon-gold-6454s", "xeon-gold-6454s-2s"):
        cpu = get_cpu(name)
        assert cpu.peak_gbps == pytest.approx(dram_gbps(8, 4800))
        assert cpu.peak_tflops == round(cpu_peak_tflops(32, 3.4, "avx512-vnni-int8"), 2)
    one, two = get_cpu("xeon-gold-6454s"), get_cpu("xeon-gold-6454s-2s")
    assert (one.sockets, two.sockets, two.cores) == (1, 2, 64)
    # per-socket rates: the two-socket host reads and computes twice as fast as one socket
    assert two.read_gbps == pytest.approx(2 * one.read_gbps)
    assert two.compute_tflops == pytest.approx(2 * one.compute_tflops)


def test_host_rates_are_written_from_the_committed_fit() -> None:
    hosts = [f for f in FITTED if f.catalog == "hosts"]
    assert {(f.entry, f.field) for f in hosts} == {(h, "tflops") for h in ("xeon-gold-6454s", "xeon-gold-6454s-2s")}
    for f in hosts:
        assert f.fit == "ktransformers-deepseek-v3" and f.key == f"hardware.cpu.{f.field}"
        assert getattr(get_cpu(f.entry), f.field) == value(f)
        assert get_cpu(f.entry).sources[f.field].startswith("fit: `simctl fit measurements/ktransformers-deepseek-v3")
    # the read rate and the fixed time are the kernel's own measurement, not fitted
    for h in ("xeon-gold-6454s", "xeon-gold-6454s-2s"):
        assert get_cpu(h).sources["mem_gbps"].startswith("measurement: ")
    # the time outside the kernel is fitted as the runtime's per-layer hand-off, one value
    switch = [f for f in FITTED if f.key == "runtime.cpu_switch_us"]
    assert [(f.entry, f.fit) for f in switch] == [("ktransformers-v0.2", "ktransformers-deepseek-v3")]


def test_a_host_beyond_physics_is_refused_in_one_line() -> None:
    with pytest.raises(CatalogError) as e:
        get_hardware({"base": "rtx-4090d", "cpu": {"base": "xeon-gold-6454s", "mem_gbps": 400}})
    assert "mem_gbps (400) exceeds the socket's channels (peak_gbps 307.2): beyond physics" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(CatalogError, match=r"tflops \(30\) exceeds the socket's cores \(peak_tflops 27.85\)"):
        get_hardware({"base": "rtx-4090d", "cpu": {"base": "xeon-gold-6454s-2s", "tflops": 30}})
    with pytest.raises(CatalogError, match=r"cores \(9\) is not a whole number per socket \(2 sockets\)"):
        get_hardware({"base": "rtx-4090d", "cpu": {"cores": 9, "sockets": 2}})


class _Row:
    role = "fit"
    reference = None
    where = "rows[0]"
    measured = {"tokens_per_s": 8.0}

    def __init__(self, host: str) -> None:
        self.data: dict[str, Any] = {"hardware": {"base": "rtx-4090d", "cpu": {"base": host}}}


def test_host_rates_are_bounded_per_socket() -> None:
    read = physical_bound("hardware.cpu.mem_gbps", [_Row("xeon-gold-6454s"), _Row("xeon-gold-6454s-2s")])
    assert read is not None and read[0] == pytest.approx(307.2)
    assert "GB/s per socket" in read[1] and "peak_gbps: physics: 8 channels" in read[1]
    compute = physical_bound("hardware.cpu.tflops", [_Row("xeon-gold-6454s-2s")])
    assert compute is not None and compute[0] == 27.85 and "TFLOP/s per socket (peak_tflops: physics: " in compute[1]
    # a host without peaks gives no bound
    assert physical_bound("hardware.cpu.mem_gbps", [_Row("ddr5-desktop-2ch")]) is None
    assert "hardware.cpu.call_us" in missing_cost("hardware.cpu.mem_gbps", "min")
    assert "runtime.cpu_switch_us" in missing_cost("hardware.cpu.tflops", "max")


def test_a_fit_range_beyond_the_channels_is_refused(tmp_path: Path) -> None:
    doc = {"name": "kt", "source": "made up",
           "base": {"trace": {"synthetic": {"model": "mixtral-8x7b", "num_layers": 2, "requests": 1, "prompt_len": 4,
                                            "decode_len": 2, "seed": 0}},
                    "model": {"base": "mixtral-8x7b", "num_layers": 2},
                    "hardware": {"base": "rtx-4090d", "cpu": {"base": "xeon-gold-6454s"}},
                    "cache": {"experts_per_layer": 1}, "policy": {"name": "cpu-moe", "params": {"cpu_moe": True}}},
           "fit": {"hardware.cpu.mem_gbps": {"min": 400, "max": 1000}},
           "rows": [{"set": {"seed": 0}, "tokens_per_s": 8.0, "role": "fit"}]}
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(FitError) as e:
        load_measurements(p)
    assert "range [400, 1000] lies beyond physics: at most 307.2" in str(e.value) and "\n" not in str(e.value)


def _hw(sockets: int, cores: int) -> Any:
    """tiny_hw (100 us layers, 50 us GPU experts) with a roofline host of ``sockets`` sockets, 5 GB/s each."""
    cpu = {"sockets": sockets, "cores": cores, "mem_gbps": 5, "peak_gbps": 6, "thread_gbps": 10, "tflops": 1,
           "call_us": 0}
    return get_hardware({**tiny_hw().model_dump(), "name": "tiny-sockets", "cpu": cpu})


def test_cpu_experts_read_at_every_socket_s_rate() -> None:
    tr = make_trace([[[0], [1], [2]], [[3], [0], [1]]], num_experts=4)
    rt = RuntimeSpec(name="plain", cpu_switch_us=0)
    model = tiny_model(3, 4, 1)   # 3 MB experts: 600 us at one socket's 5 GB/s, 300 us at two sockets' 10
    two, _ = run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 2}), model, _hw(2, 8), budget_experts=4, runtime=rt)
    # layers 0 and 1 on the CPU: 100 us + 3 MB / 10 GB/s (the 6 MFLOP at 2 TFLOP/s take 3 us, under the read);
    # layer 2 on the GPU: 100 + 50 us
    assert [round(s.t_end / US) for s in steps(two)] == [400, 800, 950, 1350, 1750, 1900]
    one, _ = run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 2}), model, _hw(1, 4), budget_experts=4, runtime=rt)
    assert [round(s.t_end / US) for s in steps(one)] == [700, 1400, 1550, 2250, 2950, 3100]
