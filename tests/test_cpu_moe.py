"""``cpu-moe`` (llama.cpp ``--cpu-moe`` / ``--n-cpu-moe`` / ``-ot``): which layers stay on the
CPU, exact timelines of CPU experts, op offload of a 32-token batch and the GPU hot-cache, and
the one-line refusal of a placement the budget cannot hold."""

from __future__ import annotations

import pytest

from moesim.policies.contract.base import PolicySetupError
from moesim.policies.contract.registry import PolicyError, make_policy
from moesim.policies.llamacpp.placement import cpu_layers, parse_overrides
from moesim.sim.config.catalog import get_hardware
from moesim.traces.format.trace_file import DECODE, PREFILL
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def _hw():  # type: ignore[no-untyped-def]
    """tiny_hw (100 us layers, 50 us GPU experts, 1000 us copies) with 300 us CPU experts."""
    return get_hardware({**tiny_hw().model_dump(), "name": "tiny-cpu", "cpu": {"expert_us": 300, "call_us": 0}})


def test_placement_follows_llama_cpp_rules() -> None:
    assert cpu_layers(4, n_cpu_moe=2) == {0, 1}
    assert cpu_layers(4, n_cpu_moe=2, dense_blocks=1) == {0}   # block 0 is dense: one MoE layer
    # -ot patterns are searched, not anchored: blk\.1 also matches blocks 10 and 11
    assert cpu_layers(12, overrides=parse_overrides(r"blk\.1=CPU")) == {1, 10, 11}
    assert cpu_layers(12, overrides=parse_overrides(r"blk\.1\.ffn_(up|down|gate)_exps=CPU")) == {1}
    assert cpu_layers(3, overrides=parse_overrides("exps=CPU")) == {0, 1, 2}
    # the user's overrides come before --n-cpu-moe's: block 0 stays on the GPU
    assert cpu_layers(4, n_cpu_moe=2, overrides=parse_overrides(r"blk\.0\.=CUDA0")) == {1}
    with pytest.raises(ValueError, match="block 0 on the CPU and others on the GPU"):
        cpu_layers(2, overrides=parse_overrides(r"blk\.0\.ffn_up_exps=CPU"))
    with pytest.raises(PolicyError, match=r"override_tensor: 'exps' is not PATTERN=BUFFER"):
        make_policy("cpu-moe", {"override_tensor": "exps"})
    with pytest.raises(PolicyError, match="bad pattern"):
        make_policy("cpu-moe", {"override_tensor": "blk(=CPU"})


def test_cpu_layers_run_on_the_cpu_gpu_layers_stay_resident() -> None:
    tr = make_trace([[[0], [1], [2]], [[3], [0], [1]]], num_experts=4)
    eng, m = run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 2}), tiny_model(3, 4, 1), _hw(), budget_experts=4)
    # per token: layer 0 and 1: 100 us + a 300 us CPU expert; layer 2: 100 us + a 50 us GPU hit
    assert [round(s.t_end / US) for s in steps(eng)] == [400, 800, 950, 1350, 1750, 1900]
    assert m["cpu_expert_runs"] == 4 and m["hits"] == 2 and m["misses"] == 0 and m["h2d_gb"] == 0
    assert eng.state.path == "fast"   # CPU experts: the SimPy-free driver replays them
    # the budget held layer 2 and nothing more: op offload is off, and the run says so
    assert any("op offload" in w for w in eng.state.warnings)


def test_a_placement_that_does_not_fit_is_refused() -> None:
    tr = make_trace([[[0], [1], [2]]], num_experts=4)
    with pytest.raises(PolicySetupError, match=r"^cpu-moe: 3 GPU layers x 4 experts need 12 experts \(0\.03 GiB\); "
                                               r"the expert budget holds 4 \(0\.01 GiB\): raise n_cpu_moe or the budget$"):
        run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 0}), tiny_model(3, 4, 1), _hw(), budget_experts=4)


def test_without_a_count_the_fewest_layers_go_to_the_cpu() -> None:
    tr = make_trace([[[0], [1], [2]]], num_experts=4)
    for budget, cpu in ((4, [0, 1]), (8, [0]), (12, [])):
        pol = make_policy("cpu-moe")
        run_engine(tr, pol, tiny_model(3, 4, 1), _hw(), budget_experts=budget)
        assert pol.report()["cpu_layers"] == cpu


def test_op_offload_copies_only_the_routed_experts_for_a_32_token_batch() -> None:
    # llama.cpp since PR #15346 (op_offload_copy "used", the default): 32 prompt tokens at layer 0
    # (a CPU layer) route to experts 0 and 2 only; only those two are copied, from pinned memory
    # (mmap off: the CUDA host buffer). Then one decode token.
    ex = [[[0], [1]]] * 16 + [[[2], [1]]] * 16 + [[[3], [1]]]
    tr = make_trace(ex, num_experts=4, phases=[PREFILL] * 32 + [DECODE])
    pol = make_policy("cpu-moe", {"n_cpu_moe": 1, "mmap": False})
    assert pol.host_memory == "pinned"
    eng, m = run_engine(tr, pol, tiny_model(2, 4, 1), _hw(), budget_experts=8, phases=("prefill", "decode"))
    # layer 0 of the prompt: attention to 100 us; experts 0 and 2 load on demand one after the
    # other (100-1100, 1100-2100), each computing when it lands (1150, 2150). Layer 1 hits (2300).
    # The decode token runs expert 3 of layer 0 on the CPU (2300 + 100 + 300), layer 1 hits (2850).
    assert [round(s.t_end / US) for s in steps(eng)] == [2150, 2300, 2700, 2850]
    assert m["demand_gb"] * 1e9 == pytest.approx(6e6) and m["prefetch_gb"] == 0 and m["h2d_gb"] * 1e9 == pytest.approx(6e6)
    assert m["cpu_expert_runs"] == 1 and pol.report()["op_offload_passes"] == 1
    assert sorted({k[0] for k in eng.state.vram.units}) == [1]   # the copies were dropped after their layer
    # with mmap (llama.cpp's default) the CPU experts sit in pageable memory: each copy at the
    # pageable rate, here min(0.5 x 3, 7.5) = 1.5 GB/s, 2000 us a 3 MB expert
    pag = make_policy("cpu-moe", {"n_cpu_moe": 1})
    assert pag.host_memory == "pageable" and make_policy("cpu-moe", {"mmap": False, "no_host": True}).host_memory == "pageable"
    eng_p, _ = run_engine(tr, pag, tiny_model(2, 4, 1), _hw(), budget_experts=8, phases=("prefill", "decode"))
    assert [round(s.t_end / US) for s in steps(eng_p)] == [4150, 4300, 4700, 4850]
    with pytest.raises(PolicyError, match="op_offload_copy must be one of used, all"):
        make_policy("cpu-moe", {"op_offload_copy": "whole"})


def test_op_offload_copies_the_whole_layer_before_pr_15346() -> None:
    # op_offload_copy "all" (llama.cpp builds before PR #15346): 32 prompt tokens all routed to
    # expert 0 at layer 0 (a CPU layer), then one decode token; pinned copies (mmap off)
    ex = [[[0], [1]]] * 32 + [[[2], [1]]]
    tr = make_trace(ex, num_experts=4, phases=[PREFILL] * 32 + [DECODE])
    pol = make_policy("cpu-moe", {"n_cpu_moe": 1, "op_offload_copy": "all", "mmap": False})
    eng, m = run_engine(tr, pol, tiny_model(2, 4, 1), _hw(), budget_experts=8, phases=("prefill", "decode"))
    # layer 0 of the prompt: attention to 100 us; experts 1, 2, 3 are copied (1 starts at once),
    # the routed expert 0 loads on demand ahead of 2 and 3 (1100-2100) and computes; the layer
    # waits for all four copies (4100). Layer 1 hits (4250). The decode token runs expert 2 of
    # layer 0 on the CPU: the copies were dropped after their layer.
    assert [round(s.t_end / US) for s in steps(eng)] == [4100, 4250, 4650, 4800]
    assert m["demand_gb"] * 1e9 == pytest.approx(3e6) and m["prefetch_gb"] * 1e9 == pytest.approx(9e6)
    assert m["cpu_expert_runs"] == 1
    assert pol.report()["op_offload_passes"] == 1
    assert sorted({k[0] for k in eng.state.vram.units}) == [1]
    # op_offload_min_batch: 0 (--no-op-offload) runs the prompt's layer 0 on the CPU instead
    eng2, m2 = run_engine(tr, make_policy("cpu-moe", {"n_cpu_moe": 1, "op_offload_min_batch": 0, "mmap": False}),
                          tiny_model(2, 4, 1), _hw(), budget_experts=8, phases=("prefill", "decode"))
    assert m2["h2d_gb"] == 0 and m2["cpu_expert_runs"] == 2
    assert round(steps(eng2)[0].t_end / US) == 400


def test_hot_cache_uploads_a_cpu_expert_and_hits_it_later() -> None:
    tr = make_trace([[[0]], [[0]], [[0]], [[0]], [[1]], [[0]]], num_experts=4)
    pol = make_policy("cpu-moe", {"cpu_moe": True, "hot_cache_slots": 1, "mmap": False})   # pinned uploads
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), _hw(), budget_experts=1)
    # token 1 runs expert 0 on the CPU (100-400) and uploads it (100-1100); tokens 2 and 3 still
    # find it in flight and use the CPU; token 4 hits it on the GPU. Token 5's expert 1 runs on
    # the CPU and replaces it (the layer's least recently used copy); token 6 finds expert 0 gone.
    assert [round(s.t_end / US) for s in steps(eng)] == [400, 800, 1200, 1350, 1750, 2150]
    assert [s.hits for s in steps(eng)] == [0, 0, 0, 1, 0, 0]
    assert m["cpu_expert_runs"] == 5
    assert pol.report()["hot_uploads"] == 2
    assert list(eng.state.vram.units) == [(0, 1, 0)]
