"""The context of a request (workload.context_tokens): KV bytes per token from the catalog's
attention shapes, what each iteration's attention reads, the layer time it adds (an exact
timeline), the KV cache in the VRAM budget (a property) and one-line refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.baselines.caching import LRU
from moesim.sim.config.catalog import GIB, get_hardware, get_model, model_names
from moesim.sim.config.scenario import ScenarioError, load_scenario
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.kv_budget import kv_budget, kv_bytes
from moesim.sim.run.metrics import compute_metrics
from moesim.sim.run.runner import run_loaded
from tests.util import PREFILL, ROOT, make_trace, random_trace, step_us


def attn_model(layers: int = 1, experts: int = 2, top_k: int = 1) -> Any:
    """:func:`tests.util.tiny_model` (3 MB experts) with Mixtral's attention shape: 4 KiB of KV
    per token and layer."""
    return get_model({"name": "tiny", "num_layers": layers, "num_experts": experts, "top_k": top_k,
                      "hidden_size": 1000, "expert_intermediate_size": 1000, "dtype_bytes": 1,
                      "non_expert_bytes": 0, "attention_heads": 32, "kv_heads": 8, "head_dim": 128})


def slope_hw(slope_us: float | None = 2.0, vram_gib: float = 1.0) -> Any:
    costs: dict[str, float] = {"layer_us": 100.0, "expert_us": 50.0}
    if slope_us is not None:
        costs["layer_us_per_context_token"] = slope_us
    return get_hardware({"name": "tiny-gpu", "vram_gib": vram_gib, "pcie_gbps": 3.0, "pcie_latency_us": 0.0,
                         "peak_tflops": 100, "hbm_gbps": 1000, "costs": costs})


@pytest.mark.parametrize(("name", "per_token"), [
    ("mixtral-8x7b", 8 * 128 * 2 * 2),          # 8 KV heads x 128 x (K and V) x 2 B = 4 KiB
    ("qwen3-30b-a3b", 4 * 128 * 2 * 2),         # 4 KV heads: 2 KiB
    ("olmoe-1b-7b", 16 * 128 * 2 * 2),          # no GQA: 8 KiB
    ("deepseek-v2-lite", (512 + 64) * 2),       # MLA: latent 512 + rotary key 64, 2 B
    ("deepseek-v3", (512 + 64) * 2),
    ("tiny-moe", 2 * 32 * 2 * 2),
])
def test_kv_bytes_per_token_match_hand_computed_values(name: str, per_token: int) -> None:
    assert get_model(name).kv_bytes_per_token == per_token


def test_every_catalog_model_has_an_attention_shape_with_its_source() -> None:
    for name in model_names():
        m = get_model(name)
        assert m.kv_bytes_per_token and m.attention_flops_per_pair and m.attention_source, name


def test_attention_fields_stay_out_of_dumps() -> None:
    assert "kv_heads" not in get_model("mixtral-8x7b").model_dump()


def test_each_iteration_reads_its_requests_contexts() -> None:
    # request 0: a 3-token prompt then 2 decoded tokens; request 1: 2 decoded tokens; batch 2
    tr = make_trace([[[0]]] * 7, num_experts=2, requests=[0, 0, 0, 0, 0, 1, 1],
                    phases=[PREFILL, PREFILL, PREFILL, 1, 1, 1, 1])
    wl = build_workload(tr, batch_size=2, phases=("prefill", "decode"), context_tokens=10)
    got = [(it.n_tokens, it.kv_tokens, it.attn_pairs) for it in wl.iterations]
    # prefill: 10 + 3 read, 3 x 10 + (1 + 2 + 3) pairs; decode: 14 + 11, then 15 + 12
    assert got == [(3, 13, 36), (2, 25, 25), (2, 27, 27)]
    assert wl.peak_kv_tokens == 15 + 12
    assert [it.kv_tokens for it in build_workload(tr, batch_size=2, phases=("prefill", "decode")).iterations] == [0, 0, 0]


def _engine(wl: Any, model: Any, hw: Any, budget_experts: int, fast: bool) -> Engine:
    return Engine(wl, LRU(), CostModel(model, hw), budget_bytes=budget_experts * model.expert_bytes,
                  check_invariants=True, fast_replay=FAST_PATH if fast else None)


@pytest.mark.parametrize("fast", [False, True])
def test_layer_time_grows_by_the_slope_per_token_of_context(fast: bool) -> None:
    # one layer, expert 0 every token, one slot: a miss (1000 us copy) then hits. Context 10 at
    # 2 us a token: 100 + 2 x 11, then x 12, x 13 of non-MoE time before the 50 us expert
    tr = make_trace([[[0]], [[0]], [[0]]], num_experts=2)
    eng = _engine(build_workload(tr, context_tokens=10), attn_model(), slope_hw(), 1, fast)
    eng.run()
    assert step_us(eng) == [122 + 1000 + 50, 124 + 50, 126 + 50]
    base = _engine(build_workload(tr), attn_model(), slope_hw(), 1, fast)
    base.run()
    assert step_us(base) == [100 + 1000 + 50, 150, 150]


def test_without_a_measured_slope_the_roofline_reads_the_kv_bytes() -> None:
    m, hw = attn_model(), slope_hw(None)
    cost = CostModel(m, hw)
    # 1000 tokens x 4096 B at 1000 GB/s; flops 1000 x 4 x 32 x 128 at 100 TFLOP/s are less
    assert cost.context_s(1000, 1000) == pytest.approx(1000 * 4096 / 1e12)
    # a prefill's quadratic pairs win once compute exceeds the read
    assert cost.context_s(1000, 10**7) == pytest.approx(10**7 * 4 * 32 * 128 / 100e12)
    assert cost.context_s(0, 0) == 0.0


def test_fast_and_event_replays_agree_with_a_context() -> None:
    tr = random_trace(3, layers=3, experts=8, top_k=2, requests=3, prompt=3, decode=8)
    model, hw = attn_model(3, 8, 2), slope_hw(None)
    runs = []
    for fast in (False, True):
        eng = _engine(build_workload(tr, batch_size=2, phases=("prefill", "decode"), context_tokens=500),
                      model, hw, 18, fast)
        eng.run()
        runs.append((compute_metrics(eng.state), eng.state.steps.columns()))
    (m0, s0), (m1, s1) = runs
    assert m0["engine_path"] == "event" and m1["engine_path"] != "event", m1.get("engine_path_reason")
    for key in ("tpot_ms", "ttft_ms", "sim_time_s", "hit_rate", "h2d_gb"):
        assert m0[key] == m1[key]
    np.testing.assert_array_equal(s0["t_end"], s1["t_end"])


@settings(max_examples=40, deadline=None)
@given(context=st.integers(1, 60_000), batch=st.integers(1, 3), epl=st.integers(1, 8))
def test_weights_kv_and_experts_never_exceed_vram(context: int, batch: int, epl: int) -> None:
    tr = random_trace(1, layers=2, experts=8, top_k=2, requests=3, prompt=2, decode=4)
    model = attn_model(2, 8, 2).model_copy(update={"non_expert_bytes": 100 * 2**20})
    hw = slope_hw(None, vram_gib=0.25)
    wl = build_workload(tr, batch_size=batch, phases=("prefill", "decode"), context_tokens=context)
    asked = epl * 2 * model.expert_bytes
    try:
        budget = kv_budget("s", "experts_per_layer", model, hw, wl, asked, 0)
    except ScenarioError as exc:
        assert "\n" not in str(exc)
        assert model.non_expert_bytes + kv_bytes(model, wl) + min(asked, model.expert_bytes) > 0.25 * GIB
        return
    assert 0 < budget <= asked
    assert model.non_expert_bytes + kv_bytes(model, wl) + budget <= 0.25 * GIB
    eng = _engine(wl, model, hw, budget // model.expert_bytes, True)
    eng.run()
    assert eng.state.stats.vram_peak_bytes <= budget


def test_a_kv_cache_that_does_not_fit_is_one_line() -> None:
    with pytest.raises(ScenarioError, match=r"workload.context_tokens: the KV cache at its peak \(\d+\.\d+ GiB") as exc:
        run_loaded(load_scenario(ROOT / "scenarios" / "mixtral-4090-lru.yaml",
                                 ["workload.context_tokens=200000", "workload.requests=1"]))
    assert "\n" not in str(exc.value)


def test_a_run_with_a_context_reports_its_kv_cache_and_zero_keeps_the_keys_out() -> None:
    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    res = run_loaded(load_scenario(scen, ["workload.context_tokens=8192", "workload.requests=1"]))
    m = res.metrics
    assert m["kv_bytes_per_token_layer"] == 4096 and m["context_tokens"] == 8192
    assert m["kv_peak_tokens"] == 8192 + 32 + 64   # prompt 32, 64 decoded
    assert m["kv_gib"] == pytest.approx(m["kv_peak_tokens"] * 4096 * 32 / GIB)
    assert m["experts_held"] == 128
    plain = run_loaded(load_scenario(scen, ["workload.context_tokens=0", "workload.requests=1"])).metrics
    assert "kv_gib" not in plain and plain["tpot_ms"]["mean"] < m["tpot_ms"]["mean"]


def test_advise_keeps_the_batchs_kv_cache_back_from_the_experts() -> None:
    from moesim.sim.study.advise import AdviseRequest, build

    def room(context: int, batch: int) -> tuple[float, list[str]]:
        req = AdviseRequest(model="mixtral-8x7b", gpu="rtx-4090", vram_gib=24, host_gib=64, bits=[4.5],
                            systems=["lru"], decode_tokens=8, context_tokens=context, batch=batch)
        _, options, _, _ = build(req)
        return options[0].memory.expert_room / GIB, [o.setting for o in options]

    plain, _ = room(0, 1)
    long, settings_long = room(8192, 8)
    # 8 x (8192 + 8) tokens x 4 KiB x 32 layers = 8.01 GiB of KV cache, on top of the 1.5 GiB reserve
    assert plain - long == pytest.approx(8 * 8200 * 4096 * 32 / GIB)
    assert plain == pytest.approx(24 - 1.5)
    assert len(settings_long) < len(room(0, 1)[1])


def test_a_context_on_a_model_without_an_attention_shape_is_one_line() -> None:
    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    bare = "{name: bare, num_layers: 32, num_experts: 8, top_k: 2, hidden_size: 4096, expert_intermediate_size: 14336, dtype_bytes: 0.5}"
    with pytest.raises(ScenarioError, match="gives no attention shape") as exc:
        run_loaded(load_scenario(scen, [f"model={bare}", "workload.context_tokens=100", "workload.requests=1"]))
    assert "\n" not in str(exc.value)


def test_the_kv_cache_cuts_the_expert_budget_exact_timeline() -> None:
    # one layer, experts 0, 1, 0; the cache asks for both. 8 MiB of VRAM: with a context of 1000
    # the KV cache at its peak (1003 tokens x 4 KiB = 3.92 MiB) leaves room for one 3 MB expert,
    # so the third token misses again: three 1000 us copies, and layers of 100 + 2 us x 1001..1003
    tr = make_trace([[[0]], [[1]], [[0]]], num_experts=2)
    model, hw = attn_model(), slope_hw(vram_gib=8 / 1024)
    asked = 2 * model.expert_bytes
    wl = build_workload(tr, context_tokens=1000)
    budget = kv_budget("s", "experts_per_layer", model, hw, wl, asked, 0)
    assert budget == model.expert_bytes
    eng = _engine(wl, model, hw, 1, False)
    eng.run()
    assert step_us(eng) == [2102 + 1000 + 50, 2104 + 1000 + 50, 2106 + 1000 + 50]
    plain = build_workload(tr)
    assert kv_budget("s", "experts_per_layer", model, hw, plain, asked, 0) == asked   # no context: as asked
    base = _engine(plain, model, hw, 2, False)
    base.run()
    assert step_us(base) == [1150, 1150, 150]


def test_kv_read_gbps_is_the_rate_of_the_kv_reads() -> None:
    m = attn_model()
    hw = get_hardware({"name": "tiny-gpu", "vram_gib": 1.0, "pcie_gbps": 3.0, "peak_tflops": 100, "hbm_gbps": 1000,
                       "kv_read_gbps": 250})
    # 1000 tokens x 4096 B at the 250 GB/s the reads reach (not the memory's 1000)
    assert CostModel(m, hw).context_s(1000, 1000) == 1000 * 4096 / 250e9
    # a measured slope still replaces the read; the quadratic compute still wins a long prefill
    calibrated = hw.model_copy(update={"costs": slope_hw(2.0).costs})
    assert CostModel(m, calibrated).context_s(1000, 1000) == pytest.approx(1000 * 2.0e-6)
    assert CostModel(m, hw).context_s(1000, 10**8) == pytest.approx(10**8 * 4 * 32 * 128 / 100e12)
    # attention_tflops: the rate of the products, in place of the peak
    slow = hw.model_copy(update={"attention_tflops": 25.0})
    assert CostModel(m, slow).context_s(1000, 10**8) == pytest.approx(10**8 * 4 * 32 * 128 / 25e12)
    assert hw.model_dump(exclude_none=True)["kv_read_gbps"] == 250
    assert "kv_read_gbps" not in get_hardware("rtx-4090").model_dump(exclude_none=True)


@pytest.mark.parametrize(("field", "value", "limit"), [("kv_read_gbps", 5000, "hbm_gbps"),
                                                      ("attention_tflops", 1000, "peak_tflops")])
def test_attention_faster_than_the_hardware_is_one_line(field: str, value: float, limit: str) -> None:
    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    with pytest.raises(ScenarioError, match=field) as exc:
        load_scenario(scen, [f"hardware={{base: rtx-4090, {field}: {value}}}"]).hardware_spec()
    assert "\n" not in str(exc.value) and limit in str(exc.value)
