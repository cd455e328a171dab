"""The offload-side costs of issue 32: a per-copy host cost of synchronous pageable copies
(``runtime.pageable_copy_us``) on exact timelines, paid by pageable copies only and by every
replay; and the cache's cold or warm start stated in every result (``cache_start``)."""

from __future__ import annotations

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import RuntimeSpec, get_model
from moesim.sim.run.metrics import cache_start
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


def _accelerate_run(copy_us: float) -> list[int]:
    model = get_model({**tiny_model(3, 4, 1).model_dump(), "non_expert_bytes": 9_000_000})
    tr = make_trace([[[0], [1], [2]], [[3], [1], [0]]], num_experts=4)
    rt = RuntimeSpec(name="t", pageable_copy_us=copy_us)
    eng, _ = run_engine(tr, make_policy("accelerate"), model, tiny_hw(), budget_experts=8, runtime=rt)
    return [round(s.t_end / US) for s in steps(eng)]


def test_pageable_copy_cost_on_every_synchronous_copy() -> None:
    # as test_fiddler_accelerate: layer 0 resident (150 us); layers 1 and 2 copy their non-expert
    # weights (2000 us) and four experts (2000 us each) from pageable memory; each of the five
    # copies now also takes 500 us of host work: 2500 + 100 + 4 x 2500 = 12600 per streamed layer
    per_token = 150 + 2 * 12600
    assert _accelerate_run(500.0) == [150, 12750, 25350, per_token + 150, per_token + 12750, 2 * per_token]
    assert _accelerate_run(0.0)[-1] == 2 * (150 + 2 * 10100)   # zero: the timeline as before


def test_pinned_copies_do_not_pay_it_and_the_fast_replay_agrees() -> None:
    tr = make_trace([[[0]], [[1]], [[2]], [[0]]], num_experts=4)
    base, m0 = run_engine(tr, make_policy("lru"), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    rt = RuntimeSpec(name="t", pageable_copy_us=500.0)
    eng, m1 = run_engine(tr, make_policy("lru"), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2, runtime=rt)
    assert [s.t_end for s in steps(eng)] == [s.t_end for s in steps(base)]
    assert eng.state.path != "event", eng.state.path_reason   # the field is declared to the fast replays
    assert m1["tpot_ms"] == m0["tpot_ms"]


def test_cache_start_is_stated() -> None:
    assert (cache_start("empty"), cache_start("popular"), cache_start("random")) == ("cold", "warm", "warm")
    tr = make_trace([[[0]], [[1]]], num_experts=4)
    for initial, start in (("empty", "cold"), ("random", "warm")):
        _, m = run_engine(tr, make_policy("lru"), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2, initial=initial)
        assert m["cache_start"] == start


def test_a_runtime_that_does_not_pin_makes_every_policy_copy_pageable() -> None:
    # lru, one layer, 2 experts of room: three misses, then a hit. Pinned: 100 (layer) + 1000
    # (3 MB at 3 GB/s) + 50 (expert) a step; runtime.host_memory pageable: the copy at the
    # pageable rule's 1.5 GB/s (2000 us), plus pageable_copy_us where set; "pinned" or None:
    # the policy's choice, as before
    tr = make_trace([[[0]], [[1]], [[2]], [[0]]], num_experts=4)

    def run(rt: RuntimeSpec | None) -> list[int]:
        eng, _ = run_engine(tr, make_policy("lru"), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2, runtime=rt)
        assert eng.state.path != "event", eng.state.path_reason   # declared to the fast replays
        return [round(s.t_end / US) for s in steps(eng)]

    assert run(None) == [1150, 2300, 3450, 4600]
    assert run(RuntimeSpec(name="t", host_memory="pinned", pageable_copy_us=500.0)) == [1150, 2300, 3450, 4600]
    assert run(RuntimeSpec(name="t", host_memory="pageable")) == [2150, 4300, 6450, 8600]
    assert run(RuntimeSpec(name="t", host_memory="pageable", pageable_copy_us=500.0)) == [2650, 5300, 7950, 10600]
