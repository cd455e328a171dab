"""The summary's runtime row (issue 21 item 3): a run with no framework overhead says so."""

from __future__ import annotations

from moesim.sim.config.catalog import get_runtime
from moesim.sim.run.outputs import runtime_line


def test_no_runtime_says_no_framework_overhead() -> None:
    line = runtime_line(get_runtime("none").model_dump(mode="json"))
    assert line.startswith("none: no framework overhead modelled")


def test_a_runtime_shows_its_times() -> None:
    line = runtime_line(get_runtime("hf-eager").model_dump(mode="json"))
    assert line == ("hf-eager: 350 us/layer, 1000 us/iteration, 0 us/token, 52 us per CPU-expert layer, "
                    "CPU experts by its own kernel (297 us a call, 0.674 of the host's read rate)")
    llama = get_runtime("llama-cpp-like").model_dump(mode="json")
    assert runtime_line(llama) == ("llama-cpp-like: 125 us/layer (25 launches x 5 us), 300 us/iteration, 0 us/token, "
                                   "52 us per CPU-expert layer")
    assert runtime_line({**llama, "cuda_graphs": True, "cpu_switch_us": 0}) == \
        "llama-cpp-like: 0 us/layer, 300 us/iteration, 0 us/token"
    # graphs for decode only: a prefill's launches are shown apart
    assert runtime_line({**llama, "cuda_graphs": True, "eager_prefill": True, "cpu_switch_us": 0}) == \
        "llama-cpp-like: 0 us/layer (prefill: +125, 25 eager launches x 5 us), 300 us/iteration, 0 us/token"
    # the shared experts beside the CPU experts: said only where graphs replay (the overlap needs them)
    assert runtime_line({**llama, "cuda_graphs": True, "overlap_shared_experts": True}).endswith(
        "52 us per CPU-expert layer, shared experts beside the CPU experts in graph-replayed one-token passes")
    assert runtime_line({**llama, "overlap_shared_experts": True}) == runtime_line(llama)
    # llama.cpp's -nkvo 1: the attention's hand-off is said, even by a runtime with no times
    assert runtime_line({**llama, "kv_on_host": True}) == runtime_line(llama) + (
        ", KV cache and attention on the host CPU (one more hand-off a layer)")
    assert "no framework overhead" not in runtime_line(
        {**get_runtime("none").model_dump(mode="json"), "kv_on_host": True})


def test_any_nonzero_time_counts_as_overhead() -> None:
    spec = {**get_runtime("none").model_dump(mode="json"), "name": "custom", "demand_load_us": 5.0}
    assert "no framework overhead" not in runtime_line(spec)
