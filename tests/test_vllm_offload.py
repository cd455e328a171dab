"""``vllm-offload`` (vLLM ``--cpu-offload-gb`` before UVA: whole offloaded layers copied from
pinned memory every pass): an exact timeline on a hand-made trace, against ``accelerate``'s
pageable stream of the same layers."""

from __future__ import annotations

import pytest

from moesim.policies.contract.base import PolicySetupError
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_model
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def test_vllm_offload_streams_offloaded_layers_from_pinned_memory() -> None:
    # three layers of four experts; non-expert weights 3 MB per layer. A budget of 8 experts
    # keeps one layer and room for one streamed layer.
    model = get_model({**tiny_model(3, 4, 1).model_dump(), "non_expert_bytes": 9_000_000})
    hw = tiny_hw()   # pinned 3 GB/s: 1000 us per 3 MB (pageable: 2000 us)
    tr = make_trace([[[0], [1], [2]], [[3], [1], [0]]], num_experts=4)
    pol = make_policy("vllm-offload")
    eng, m = run_engine(tr, pol, model, hw, budget_experts=8)
    assert pol.report() == {"resident_layers": 1} and eng.state.cost.host_memory == "pinned"
    # layer 0: 100 + a 50 us hit. Layers 1 and 2: the non-expert weights (1000 us at the pinned
    # rate, the GPU waits), attention (100), all four experts copied one after another (4000)
    # and the layer waits for the last: 5100 us each.
    per_token = 150 + 2 * 5100
    assert [round(s.t_end / US) for s in steps(eng)] == [150, 5250, 10350, per_token + 150,
                                                         per_token + 5250, 2 * per_token]
    assert m["demand_gb"] * 1e9 == pytest.approx(4 * 3e6)     # the routed experts
    assert m["prefetch_gb"] * 1e9 == pytest.approx(12 * 3e6)  # the other three of each streamed layer
    assert sorted({k[0] for k in eng.state.vram.units}) == [0]  # nothing kept between passes
    # the same stream from pageable memory (accelerate) takes twice as long per streamed layer
    _, slow = run_engine(tr, make_policy("accelerate"), model, hw, budget_experts=8)
    assert slow["h2d_gb"] == pytest.approx(m["h2d_gb"])
    assert slow["tokens_per_s"] == pytest.approx(m["tokens_per_s"] * (2 * per_token) / (2 * (150 + 2 * 10100)))


def test_vllm_offload_names_itself_when_the_budget_is_short() -> None:
    tr = make_trace([[[0], [1], [2]]], num_experts=4)
    with pytest.raises(PolicySetupError, match="vllm-offload: 2 resident layers and one streamed layer"):
        run_engine(tr, make_policy("vllm-offload", {"resident_layers": 2}), tiny_model(3, 4, 1), tiny_hw(),
                   budget_experts=8)
