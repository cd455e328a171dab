"""A runtime's own CPU expert kernel (``runtime.cpu_kernel``) and NUMA-unaware reads
(``runtime.numa_aware``, ``hardware.cpu.numa_unaware_gbps``): exact CPU expert times on a
hand-sized model, a measured host left alone, the rule's three conditions, the catalog entries
that carry them, and advise's caveat for a multi-socket host without the figure."""

from __future__ import annotations

from typing import Any

import pytest

from moesim.sim.config.catalog import CatalogError, get_cpu, get_hardware, get_model, get_runtime
from moesim.sim.engine.cost import CostModel

US = 1e-6
# tiny-moe: an expert is 3 x 128 x 128 weights, 49,152 parameters, 98,304 B at 2 B a weight
EXPERT_BYTES, EXPERT_PARAMS = 98_304, 49_152
HOST = {"cores": 8, "mem_gbps": 50, "thread_gbps": 10, "tflops": 1.0, "call_us": 20, "source": "test"}
KERNEL = {"call_us": 100, "read_share": 0.5, "compute_share": 0.25}


def _cost(cpu: dict[str, Any], runtime: dict[str, Any] | None = None) -> CostModel:
    m = get_model("tiny-moe")
    assert (m.expert_bytes, m.expert_params) == (EXPERT_BYTES, EXPERT_PARAMS)
    rt = get_runtime({"name": "t", **(runtime or {})})
    return CostModel(m, get_hardware({"base": "rtx-4090", "cpu": cpu}), rt)


def test_kernel_replaces_call_and_scales_the_rates() -> None:
    # host: read min(50, 8 x 10) = 50 GB/s, compute 1.0 TFLOP/s; the kernel reaches 25 GB/s and 0.25 TFLOP/s
    plain = _cost(HOST)
    assert plain.cpu_expert_s(1) == pytest.approx(EXPERT_BYTES / 50e9 + 20 * US, rel=1e-12)
    own = _cost(HOST, {"cpu_kernel": KERNEL})
    assert own.cpu_expert_s(1) == pytest.approx(3.93216e-6 + 100 * US, rel=1e-12)        # 98,304 B / 25 GB/s
    # 64 tokens: 2 x 49,152 x 64 FLOPs / 0.25 TFLOP/s = 25.165824 us, above the 3.93 us read
    assert own.cpu_expert_s(64) == pytest.approx(25.165824e-6 + 100 * US, rel=1e-12)
    assert plain.cpu_expert_s(64) == pytest.approx(2 * EXPERT_PARAMS * 64 / 1e12 + 20 * US, rel=1e-12)
    assert own.cpu_expert_s(0) == 0.0


def test_a_measured_host_keeps_its_times() -> None:
    measured = {**HOST, "expert_us": 40.0, "expert_us_per_token": 2.0}
    own = _cost(measured, {"cpu_kernel": KERNEL})
    assert own.cpu_expert_s(1) == _cost(measured).cpu_expert_s(1) == pytest.approx(40 * US, rel=1e-12)
    assert own.cpu_expert_s(3) == pytest.approx(44 * US, rel=1e-12)


TWO = {**HOST, "sockets": 2, "numa_unaware_gbps": 30}   # aware: min(2 x 50, 80) = 80; unaware: min(2 x 30, 80) = 60


@pytest.mark.parametrize(("cpu", "aware", "gbps"), [
    (TWO, False, 60.0),                                    # several sockets, not aware, the figure: the rule applies
    (TWO, True, 80.0),                                     # a NUMA-aware runtime reads at mem_gbps
    ({**HOST, "sockets": 2}, False, 80.0),                 # no figure on the host: mem_gbps
    (HOST, False, 50.0),                                   # one socket: nothing to be unaware of
])
def test_numa_rule(cpu: dict[str, Any], aware: bool, gbps: float) -> None:
    c = _cost(cpu, {"numa_aware": aware})
    assert c.host_read_gbps() == gbps
    assert c.cpu_expert_s(1) == pytest.approx(EXPERT_BYTES / (gbps * 1e9) + 20 * US, rel=1e-12)


def test_numa_and_kernel_together_and_host_attention() -> None:
    c = _cost(TWO, {"cpu_kernel": KERNEL})                 # 60 GB/s x 0.5 = 30 GB/s for the expert kernel
    assert c.cpu_expert_s(1) == pytest.approx(EXPERT_BYTES / 30e9 + 100 * US, rel=1e-12)
    # host-side attention (kv_on_host) reads its KV cache at the runtime's NUMA rate, not the kernel's share
    kv = _cost(TWO, {"kv_on_host": True})
    m = kv.model
    assert kv.host_attention_s(6e6, 0.0) == pytest.approx(6e6 / 60e9 * m.attention_blocks / m.num_layers, rel=1e-12)


def test_numa_figure_only_where_it_means_something() -> None:
    with pytest.raises(CatalogError, match="numa_unaware_gbps .* one socket"):
        get_hardware({"base": "rtx-4090", "cpu": {**HOST, "numa_unaware_gbps": 30}})
    with pytest.raises(CatalogError, match=r"numa_unaware_gbps \(60\) exceeds mem_gbps \(50\)"):
        get_hardware({"base": "rtx-4090", "cpu": {**TWO, "numa_unaware_gbps": 60}})
    with pytest.raises(CatalogError, match="cpu_kernel.read_share"):
        get_runtime({"base": "hf-eager", "cpu_kernel": {"read_share": 0}})
    with pytest.raises(CatalogError, match="cpu_kernel.compute_share"):
        get_runtime({"base": "hf-eager", "cpu_kernel": {"compute_share": 1.01}})


def test_catalog_entries() -> None:
    k = get_runtime("hf-eager").cpu_kernel
    assert k is not None and (k.call_us, k.read_share, k.compute_share) == (297, 0.674, 0.25)
    assert set(k.sources) == {"call_us", "read_share", "compute_share"} and k.source
    assert get_runtime({"base": "hf-eager", "cpu_kernel": {"call_us": 10}}).cpu_kernel.read_share == 0.674
    assert get_runtime({"base": "hf-eager", "cpu_kernel": None}).cpu_kernel is None
    assert get_runtime("ktransformers-sosp25").numa_aware and get_runtime("ktransformers-v0.2").numa_aware
    assert not get_runtime("llama-cpp-like").numa_aware and not get_runtime("hf-eager").numa_aware
    host = get_cpu("xeon-platinum-8452y-2s")
    assert host.numa_unaware_gbps == 135.0 and host.sources["numa_unaware_gbps"]
    assert host.runtime_read_gbps(False) == 270.0 and host.runtime_read_gbps(True) == host.read_gbps == 440.0
    assert get_cpu("xeon-gold-6454s-2s").numa_unaware_gbps is None


def test_advise_caveat_for_a_multi_socket_host_without_the_figure() -> None:
    from moesim.sim.study.advise_host import numa_caveats

    systems = [("llama.cpp", "llama-cpp-like"), ("fiddler", "hf-eager"), ("ktx", "ktransformers-sosp25"),
               ("llama.cpp", "llama-cpp-like")]
    lines = numa_caveats(get_cpu("xeon-gold-6454s-2s"), systems)
    assert [line.split(" on ")[0] for line in lines] == ["llama.cpp", "fiddler"]   # not NUMA-aware, once each
    assert "2 x 242.4 GB/s" in lines[0] and "optimistic for llama.cpp" in lines[0] and "llama-cpp-like" in lines[0]
    assert numa_caveats(get_cpu("xeon-platinum-8452y-2s"), systems) == []        # the host gives its figure
    assert numa_caveats(get_cpu("xeon-spr-8ch"), systems) == []                  # one socket


def test_advise_prints_the_caveat_for_cpu_expert_systems_only() -> None:
    from moesim.sim.study.advise import AdviseRequest, Row, caveats
    from moesim.sim.study.advise_options import GIB, Memory, Option, Shape

    mem, shape = Memory(1000, 1000, 0, 0), Shape("t", 1, 2, GIB, 0, 16)
    rows = [Row(Option(s, p, {}, "", 1, shape, 0, rt, mem), 1.0, "ok")
            for s, p, rt in (("llama.cpp", "cpu-moe", "llama-cpp-like"), ("expert cache (lru)", "lru", "hf-eager"))]
    req = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=1, host_gib=1, cpu="xeon-gold-6454s-2s")
    numa = [c for c in caveats(req, rows, get_cpu("xeon-gold-6454s-2s")) if "NUMA" in c]
    assert len(numa) == 1 and numa[0].startswith("llama.cpp on 2 sockets")
