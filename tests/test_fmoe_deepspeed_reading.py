"""benchmarks/fmoe_deepspeed_reading.py's probe: expert-agnostic layer-wise loading with an LRU
expert cache, on a hand-timed case."""

from __future__ import annotations

from benchmarks.fmoe_deepspeed_reading import LayerwiseLRU
from moesim.policies.baselines.caching import LRU
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def test_every_absent_expert_of_a_layer_is_copied_and_only_the_routed_one_stays() -> None:
    # one layer of 3 experts, top-1, expert 0 routed twice; each copy 1000 us, attention 100 us,
    # an expert 50 us. Token 1: attention to 100; the copy of 1 starts at once (100-1100), the
    # demand load of 0 goes ahead of the queued copy of 2 (1100-2100, computed to 2150), 2 lands
    # at 3100 and the layer waits for it. Token 2: 0 hits (kept), 1 and 2 left after the layer
    # and are copied again (3200-4200, 4200-5200): 5200. Five copies of 3 MB.
    tr = make_trace([[[0]], [[0]]], num_experts=3)
    eng, m = run_engine(tr, LayerwiseLRU(), tiny_model(1, 3, 1), tiny_hw(), budget_experts=3)
    assert [round(s.t_end / US) for s in steps(eng)] == [3100, 5200]
    assert round(m["h2d_gb"], 6) == 0.015 and m["hit_rate"] == 0.5
    # the set's reading (lru) copies the routed expert only: 1150, then a hit: 1300
    eng, m = run_engine(make_trace([[[0]], [[0]]], num_experts=3), LRU(), tiny_model(1, 3, 1), tiny_hw(),
                        budget_experts=3)
    assert [round(s.t_end / US) for s in steps(eng)] == [1150, 1300] and m["hit_rate"] == 0.5


def test_importing_the_probe_registers_nothing() -> None:
    from moesim.policies.contract.registry import policy_names

    assert LayerwiseLRU.name not in policy_names()
