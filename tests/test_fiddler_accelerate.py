"""``fiddler`` (popularity placement, per-miss CPU-or-copy from the latency model) and
``accelerate`` (whole offloaded layers streamed from pageable memory each pass): exact
timelines on hand-made traces."""

from __future__ import annotations

import pytest

from moesim.policies.contract.base import PolicySetupError
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_hardware, get_model
from moesim.traces.format.trace_file import DECODE, PREFILL
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def _hw(**cpu: float):  # type: ignore[no-untyped-def]
    """tiny_hw (100 us layers, 50 us GPU experts, 1000 us copies) with 300 us + 100 us per extra
    token CPU experts."""
    spec = {"expert_us": 300.0, "expert_us_per_token": 100.0, "call_us": 0.0, **cpu}
    return get_hardware({**tiny_hw().model_dump(), "name": "tiny-cpu", "cpu": spec})


def test_fiddler_places_popular_experts_and_chooses_cpu_or_copy_per_miss() -> None:
    # prompt: 9 tokens on expert 2, 8 on expert 3; decode: 10 tokens each on experts 0 and 1,
    # so 0 and 1 are the most popular (the replayed requests serve as the profile here)
    ex = [[[2]]] * 9 + [[[3]]] * 8 + [[[0]], [[1]]] * 10
    tr = make_trace(ex, num_experts=4, phases=[PREFILL] * 17 + [DECODE] * 20)
    pol = make_policy("fiddler")
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), _hw(), budget_experts=3, phases=("prefill", "decode"))
    assert pol.popular == {(0, 0, 0), (0, 1, 0)}   # 3 slots, one kept for copies
    # Algorithm 1 with the run's costs: CPU 300 + 100 (s - 1) us against 50 us + a 1000 us copy:
    # copy from 9 tokens on
    assert [pol.copies(s) for s in (1, 8, 9)] == [False, False, True]
    # the prompt: attention to 100 us; expert 2 (9 tokens) is copied (100-1100) and runs on the
    # GPU (1150); expert 3 (8 tokens) runs on the CPU meanwhile (100-1100)
    first = steps(eng)[0]
    assert round(first.t_end / US) == 1150 and first.misses == 1 and first.cpu_experts == 1
    # every decode token hits a popular expert: 150 us each
    assert [round((b.t_end - a.t_end) / US) for a, b in zip(steps(eng), steps(eng)[1:], strict=False)] == [150] * 20
    assert pol.report() == {"gpu_experts": 2, "copied": 1, "on_cpu": 1}
    assert sorted(eng.state.vram.units) == [(0, 0, 0), (0, 1, 0)]   # the copy is not kept
    assert eng.state.path == "fast"   # CPU experts: the SimPy-free driver replays them


def test_fiddler_repo_rule_and_decode_misses_on_the_cpu() -> None:
    pol = make_policy("fiddler", {"decision": "repo"})
    assert [pol.copies(s) for s in (1, 9, 10)] == [False, False, True]   # 7 s < 70
    tr = make_trace([[[0]], [[2]], [[0]]], num_experts=4)
    eng, m = run_engine(tr, make_policy("fiddler"), tiny_model(1, 4, 1), _hw(), budget_experts=2)
    # one popular expert (0); expert 2 misses and runs on the CPU: 100 + 300 us
    assert [round(s.t_end / US) for s in steps(eng)] == [150, 550, 700]
    assert m["h2d_gb"] == 0 and m["cpu_expert_runs"] == 1


def test_accelerate_streams_offloaded_layers_from_pageable_memory() -> None:
    # three layers of four experts; non-expert weights 3 MB per layer. A budget of 8 experts
    # keeps layer 0 and room for one streamed layer (device_map="auto").
    model = get_model({**tiny_model(3, 4, 1).model_dump(), "non_expert_bytes": 9_000_000})
    hw = tiny_hw()   # pinned 3 GB/s; pageable: half, 1.5 GB/s: 2000 us per 3 MB
    assert hw.pageable_rate_gbps == 1.5
    tr = make_trace([[[0], [1], [2]], [[3], [1], [0]]], num_experts=4)
    pol = make_policy("accelerate")
    eng, m = run_engine(tr, pol, model, hw, budget_experts=8)
    assert pol.report() == {"resident_layers": 1} and eng.state.cost.host_memory == "pageable"
    # layer 0: 100 + a 50 us hit. Layers 1 and 2: the non-expert weights (2000 us, the GPU waits),
    # attention (100), then all four experts copy one after another (8000; the routed one first
    # among the queued, computing as soon as it lands) and the layer waits for the last: 10100.
    per_token = 150 + 2 * 10100
    assert [round(s.t_end / US) for s in steps(eng)] == [150, 10250, 20350, per_token + 150,
                                                         per_token + 10250, 2 * per_token]
    assert m["demand_gb"] * 1e9 == pytest.approx(4 * 3e6)    # the routed experts, two per token
    assert m["prefetch_gb"] * 1e9 == pytest.approx(12 * 3e6)  # the other three of each streamed layer
    assert m["wasted_prefetch_gb"] * 1e9 == pytest.approx(12 * 3e6)  # copied, never run, freed
    assert sorted({k[0] for k in eng.state.vram.units}) == [0]           # streamed layers are freed


def test_accelerate_refuses_resident_layers_beyond_the_budget_and_warns_below_a_layer() -> None:
    tr = make_trace([[[0], [1], [2]]], num_experts=4)
    with pytest.raises(PolicySetupError, match="accelerate: 2 resident layers and one streamed layer of 4 experts"):
        run_engine(tr, make_policy("accelerate", {"resident_layers": 2}), tiny_model(3, 4, 1), tiny_hw(),
                   budget_experts=8)
    eng, _ = run_engine(tr, make_policy("accelerate"), tiny_model(3, 4, 1), tiny_hw(), budget_experts=3)
    assert any("piecewise" in w for w in eng.state.warnings)
