"""The GPU side of a CPU-expert runtime's prefill (issue 32 item 2): eager attention that
scores a static KV cache whole (``runtime.eager_score_bytes``, ``static_cache_pad_tokens``) and
the activation copies of each CPU-expert layer by their bytes (``runtime.activation_copies``),
on an exact timeline and on kTransformers V0.2's DeepSeek-V3 prompt, the fast replay charging
them as the event loop does; both off by default."""

from __future__ import annotations

import pytest

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import RuntimeSpec, get_hardware, get_model, get_runtime
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import DECODE, PREFILL, assert_same_replays, make_trace, run_engine, steps, tiny_hw

US = 1e-6


def _model():  # type: ignore[no-untyped-def]
    """Two MoE layers of 4 experts, top-1, hidden 1000; attention of 100 heads of 250: 100,000
    FLOPs a (query, key) pair (4 x 100 x 250)."""
    return get_model({"name": "tiny-attn", "num_layers": 2, "num_experts": 4, "top_k": 1, "hidden_size": 1000,
                      "expert_intermediate_size": 1000, "dtype_bytes": 1, "non_expert_bytes": 0,
                      "attention_heads": 100, "kv_heads": 100, "head_dim": 250})


def _hw():  # type: ignore[no-untyped-def]
    """tiny_hw (100 us layers, 100 TFLOP/s, 1000 GB/s) with 300 us CPU experts and a 1.6 GB/s
    pageable rate."""
    return get_hardware({**tiny_hw().model_dump(), "name": "tiny-cpu", "pageable_gbps": 1.6,
                         "cpu": {"expert_us": 300, "call_us": 0}})


def _prefill(rt: RuntimeSpec) -> list[int]:
    """Layer ends (us) of a 4-token prompt whose two layers run two CPU experts each."""
    tr = make_trace([[[0], [2]], [[0], [2]], [[1], [2]], [[1], [3]]], num_experts=4, phases=[PREFILL] * 4)
    eng, _ = run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 2}), _model(), _hw(), budget_experts=4,
                        phases=("prefill",), runtime=rt)
    return [round(s.t_end / US) for s in steps(eng)]


def test_eager_attention_and_activation_copies_lengthen_each_prefill_layer() -> None:
    # default: 100 us layer + 40 us hand-off + two 300 us CPU experts
    assert _prefill(RuntimeSpec(name="plain", cpu_switch_us=40)) == [740, 1480]
    rt = RuntimeSpec(name="kt", cpu_switch_us=40, eager_score_bytes=25, static_cache_pad_tokens=996,
                     activation_copies="pageable")
    # eager attention: 4 queries x (4 + 996) keys = 4,000 pairs: 4,000 x 100,000 FLOPs / 100 TFLOP/s = 4 us,
    # and 100 heads x 4,000 scores x 25 B / 1,000 GB/s = 10 us; copies: 2 x 4 tokens x 1,000 x 2 B / 1.6 GB/s = 10 us
    assert _prefill(rt) == [764, 1528]


def test_pinned_activation_copies_go_at_the_link_rates() -> None:
    rt = RuntimeSpec(name="pinned", activation_copies="pinned")
    hw = get_hardware({**_hw().model_dump(), "pcie_gbps": 2.0, "d2h_gbps": 4.0})
    # 8,000 B to the host at 4 GB/s (2 us) and back at 2 GB/s (4 us)
    assert CostModel(_model(), hw, rt).cpu_switch_s(4) == pytest.approx(6 * US)
    assert CostModel(_model(), hw, RuntimeSpec(name="off")).cpu_switch_s(4) == 0.0


def test_ktransformers_v02_prompt_of_500_tokens() -> None:
    model, hw = get_model("deepseek-v3-q4km"), get_hardware("rtx-4090d")
    rt = get_runtime("ktransformers-v0.2").model_copy(update={"static_cache_pad_tokens": 1000})
    cost = CostModel(model, hw, rt)
    # MLA (absorbed): 2 x 128 x (2 x 512 + 64) = 278,528 FLOPs a pair; 500 queries x 1,500 slots;
    # 750,000 x 278,528 / 147 TFLOP/s = 1.42106 ms, 128 x 750,000 x 26 B / 1,008 GB/s = 2.47619 ms;
    # the 61 attention blocks spread over the 58 MoE layers
    assert cost.eager_attention_s(500, 0) == pytest.approx((1.421061e-3 + 2.476190e-3) * 61 / 58, rel=1e-6)
    # the prompt's hidden states to the host and back, 2 x 500 x 7,168 x 2 B at the 7.5 GB/s pageable rate
    assert cost.activation_copy_s(500) == pytest.approx(2 * 500 * 7168 * 2 / 7.5e9)
    # fused attention (every other runtime) charges none of it
    assert CostModel(model, hw, get_runtime("llama-cpp-like")).eager_attention_s(500, 0) == 0.0


def test_fast_replay_charges_eager_attention_as_the_event_loop_does() -> None:
    tr = make_trace([[[0], [2]], [[1], [2]], [[3], [0]], [[2], [1]], [[0], [3]]], num_experts=4,
                    phases=[PREFILL] * 3 + [DECODE] * 2)
    model, hw = _model(), _hw()
    rt = RuntimeSpec(name="kt", eager_score_bytes=25, static_cache_pad_tokens=996)
    runs = []
    for fast in (False, True):
        eng = Engine(build_workload(tr, phases=["prefill", "decode"]), make_policy("lru"), CostModel(model, hw, rt),
                     budget_bytes=2 * model.expert_bytes, check_invariants=True, fast_replay=FAST_PATH if fast else None)
        eng.run()
        runs.append((eng, compute_metrics(eng.state)))
    (slow, ms), (quick, mf) = runs
    assert mf["engine_path"] != ms["engine_path"]   # the fast replay took the run
    assert_same_replays(slow, ms, quick, mf)
    # a layer of the 3-token prompt: 3 queries x (3 + 996) keys, 1 ns of products and 2.5 ns of passes a pair
    plain = CostModel(model, hw, RuntimeSpec(name="plain"))
    assert CostModel(model, hw, rt).eager_attention_s(3, 0) == pytest.approx(
        3 * 999 * (100_000 / 100e12 + 100 * 25 / 1000e9)) and plain.eager_attention_s(3, 0) == 0.0


def test_eager_attention_on_a_model_without_an_attention_shape_is_one_line() -> None:
    from pathlib import Path

    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.config.scenario_error import ScenarioError
    from moesim.sim.run.runner import run_loaded

    scen = Path(__file__).resolve().parent.parent / "scenarios" / "mixtral-4090-lru.yaml"
    bare = ("{name: bare, num_layers: 32, num_experts: 8, top_k: 2, hidden_size: 4096, "
            "expert_intermediate_size: 14336, dtype_bytes: 0.5}")
    with pytest.raises(ScenarioError, match="runtime.eager_score_bytes: model bare gives no attention shape") as exc:
        run_loaded(load_scenario(scen, [f"model={bare}", "runtime={base: hf-eager, eager_score_bytes: 26}",
                                        "workload.requests=1"]))
    assert "\n" not in str(exc.value)
