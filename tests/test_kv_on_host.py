"""A runtime that keeps the KV cache in host memory (``runtime.kv_on_host``, llama.cpp's
``-nkvo 1``): every attention block pays one more GPU/CPU hand-off (``cpu_switch_us``) and reads
its context at the host's rates, on exact timelines of both replays; the flag off changes
nothing; a combination it cannot price is refused (the bad-input corpus, tests/test_bad_input.py,
runs both refusals through simctl: one line each)."""

from __future__ import annotations

from typing import Any

import pytest

from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import (
    CatalogError,
    RuntimeSpec,
    get_hardware,
    get_model,
    get_runtime,
)
from moesim.sim.config.scenario import ScenarioError, load_scenario
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.runner import run_loaded
from tests.util import ROOT, make_trace, step_us

US = 1e-6


def _model(layers: int = 1, dense_blocks: int = 0) -> Any:
    """3 MB experts with Mixtral's attention: 4 KiB of KV a token and layer, 16384 FLOPs a pair."""
    return get_model({"name": "tiny", "num_layers": layers, "num_experts": 2, "top_k": 1, "hidden_size": 1000,
                      "expert_intermediate_size": 1000, "dtype_bytes": 1, "non_expert_bytes": 0,
                      "dense_blocks": dense_blocks, "attention_heads": 32, "kv_heads": 8, "head_dim": 128})


def _hw() -> Any:
    """100 us layers, 50 us GPU experts, 1000 us copies, a measured 2 us a context token on the GPU;
    a one-core host reading 4.096 GB/s (4 KiB of KV in 1 us), 300 us CPU experts."""
    return get_hardware({"name": "tiny-gpu", "vram_gib": 1, "pcie_gbps": 3.0, "pcie_latency_us": 0.0,
                         "peak_tflops": 100, "hbm_gbps": 1000,
                         "costs": {"layer_us": 100.0, "expert_us": 50.0, "layer_us_per_context_token": 2.0},
                         "cpu": {"cores": 1, "mem_gbps": 4.096, "tflops": 1.0, "expert_us": 300, "call_us": 0}})


def _run(runtime: RuntimeSpec, *, context: int, fast: bool, policy: Any = None) -> Engine:
    tr = make_trace([[[0]], [[0]], [[0]]], num_experts=2)
    model = _model()
    eng = Engine(build_workload(tr, context_tokens=context), policy or LRU(), CostModel(model, _hw(), runtime),
                 budget_bytes=model.expert_bytes, check_invariants=True, fast_replay=FAST_PATH if fast else None)
    eng.run()
    return eng


@pytest.mark.parametrize("fast", [False, True])
def test_the_attention_hand_off_and_host_reads_add_exactly_their_time(fast: bool) -> None:
    # one layer, expert 0 on the GPU every token (a 1000 us miss, then hits); context 10, so the
    # three decode steps read 11, 12, 13 tokens of KV cache
    on = RuntimeSpec(name="nkvo", cpu_switch_us=40, kv_on_host=True)
    # on the host: 100 us + the 40 us hand-off + 11, 12, 13 tokens x 4 KiB at 4.096 GB/s (1 us a
    # token; the products, 16384 FLOPs a pair at 1 TFLOP/s, take less), not the GPU's 2 us a token
    assert step_us(_run(on, context=10, fast=fast)) == [151 + 1000 + 50, 152 + 50, 153 + 50]
    # without a context the hand-off alone
    assert step_us(_run(on, context=0, fast=fast)) == [140 + 1000 + 50, 190, 190]
    # off: the GPU's measured slope, no hand-off (cpu_switch_us is the CPU experts' only)
    off = on.model_copy(update={"kv_on_host": False})
    assert step_us(_run(off, context=10, fast=fast)) == [122 + 1000 + 50, 124 + 50, 126 + 50]
    assert step_us(_run(off, context=0, fast=fast)) == [1150, 150, 150]


@pytest.mark.parametrize("fast", [False, True])
def test_a_cpu_expert_layer_pays_both_hand_offs(fast: bool) -> None:
    # expert 0 on the CPU: 100 us, the attention's 40 us hand-off and 11 us of host reads before
    # routing, then the CPU experts' own 40 us hand-off and the 300 us expert
    on = RuntimeSpec(name="nkvo", cpu_switch_us=40, kv_on_host=True)
    eng = _run(on, context=10, fast=fast, policy=make_policy("cpu-moe", {"n_cpu_moe": 1}))
    assert step_us(eng) == [151 + 340, 152 + 340, 153 + 340]


def test_dense_blocks_spread_their_hand_offs_over_the_moe_layers() -> None:
    # two MoE layers and one dense block: three attention blocks, 3/2 of a hand-off a MoE layer
    cost = CostModel(_model(layers=2, dense_blocks=1), _hw(), RuntimeSpec(name="n", cpu_switch_us=40, kv_on_host=True))
    assert cost.kv_host_switch_s() == pytest.approx(60 * US)
    # 100 tokens x 4 KiB at 4.096 GB/s = 100 us a block, 150 us a MoE layer; the products
    # (10^6 pairs x 16384 FLOPs at 1 TFLOP/s = 16384 us a block) win for a long prompt
    assert cost.context_s(100, 100) == pytest.approx(150 * US)
    assert cost.context_s(100, 10**6) == pytest.approx(16384 * 1.5 * US)
    assert CostModel(_model(), _hw(), RuntimeSpec(name="n", cpu_switch_us=40)).kv_host_switch_s() == 0.0


def test_the_host_rate_is_the_expert_threads() -> None:
    # two of four cores at 2 GB/s each reach 4 GB/s of the socket's 8: 4 KiB a token in 1.024 us
    hw = get_hardware({**_hw().model_dump(), "costs": None,
                       "cpu": {"cores": 4, "mem_gbps": 8.0, "thread_gbps": 2.0, "threads": 2, "tflops": 1.0}})
    cost = CostModel(_model(), hw, RuntimeSpec(name="n", kv_on_host=True))
    assert cost.context_s(1000, 1000) == pytest.approx(1000 * 4096 / 4e9)


def test_the_catalog_runtimes_keep_the_kv_cache_on_the_gpu() -> None:
    assert get_runtime("llama-cpp-like").kv_on_host is False
    assert get_runtime({"base": "llama-cpp-like", "kv_on_host": True}).kv_on_host is True


def test_eager_attention_and_host_attention_together_are_refused() -> None:
    with pytest.raises(CatalogError) as err:
        get_runtime({"base": "hf-eager", "kv_on_host": True, "eager_score_bytes": 26})
    assert "kv_on_host cannot be combined with eager_score_bytes" in str(err.value)
    assert "\n" not in str(err.value)



def test_a_kv_cache_on_the_host_takes_no_vram() -> None:
    # Mixtral on an RTX 4090, 4 experts a layer asked (128): 140k tokens of KV cache (17.1 GiB) in
    # VRAM leave room for 47 of them; in host memory they cut none, and the run still reports them
    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    sets = ["workload.context_tokens=140000", "workload.requests=1"]
    gpu = run_loaded(load_scenario(scen, sets)).metrics
    host = run_loaded(load_scenario(scen, [*sets, "runtime={base: llama-cpp-like, kv_on_host: true}"])).metrics
    assert (gpu["experts_held"], host["experts_held"]) == (47, 128)
    assert host["kv_gib"] == gpu["kv_gib"] == pytest.approx(host["kv_peak_tokens"] * 4096 * 32 / 2**30)
    # the VRAM peak counts the KV cache only where it is: both runs' peaks less their experts are
    # the non-expert weights, plus the KV cache in VRAM's
    other = gpu["vram_peak_gib"] - gpu["expert_vram_peak_gib"] - gpu["kv_gib"]
    assert host["vram_peak_gib"] - host["expert_vram_peak_gib"] == pytest.approx(other) and other > 0
    # 200k tokens (24.4 GiB) do not fit beside the weights at all, unless they are on the host
    with pytest.raises(ScenarioError, match="workload.context_tokens: the KV cache at its peak"):
        run_loaded(load_scenario(scen, ["workload.context_tokens=200000", "workload.requests=1"]))
    far = ["workload.context_tokens=200000", "workload.requests=1", "runtime={base: llama-cpp-like, kv_on_host: true}"]
    assert run_loaded(load_scenario(scen, far)).metrics["experts_held"] == 128


def test_the_summary_says_where_the_kv_cache_is() -> None:
    """The summary's KV cache row: beside the experts in VRAM, or in host memory with kv_on_host
    (it said 'held beside it' for both)."""
    import io

    from rich.console import Console

    from moesim.sim.run.outputs import print_summary

    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    sets = ["workload.context_tokens=140000", "workload.requests=1"]

    def kv_row(extra: list[str]) -> str:
        buf = io.StringIO()
        print_summary(run_loaded(load_scenario(scen, [*sets, *extra])), Console(file=buf, width=400))
        return next(line for line in buf.getvalue().splitlines() if line.startswith("KV cache"))

    assert kv_row([]).rstrip().endswith("47 experts held beside it")
    on_host = kv_row(["runtime={base: llama-cpp-like, kv_on_host: true}"]).rstrip()
    assert on_host.endswith("in host memory (runtime.kv_on_host), none of it in VRAM; 128 experts held")
