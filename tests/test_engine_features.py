"""Exact timelines of the engine features the seed papers need: copy-queue discipline (fifo vs
priority), synchronous prefetch, CPU experts, runtime overhead, policy CPU cost, the lossy
path, the logits view, required columns and the profile split.

Hardware as in test_engine_timeline: layer 100 us, expert 50 us, a 3 MB expert loads in 1000 us.
"""

from __future__ import annotations

import numpy as np
import pytest

from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.base import (
    CausalityError,
    Context,
    Outcome,
    Plan,
    PolicySetupError,
    Routing,
    View,
)
from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import RuntimeSpec
from moesim.sim.engine.event_loop import PolicyError
from moesim.sim.run.profile import profile_from_trace
from tests.util import make_trace, random_trace, run_engine, step_us, steps, tiny_hw, tiny_model

MB = 3_000_000


class PrefetchWrong(LRU):
    """After layer 0, prefetches experts 2 and 3 of layer 1 (both wrong guesses)."""

    name = "test-prefetch-wrong"

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        if layer == 0:
            view.prefetch(1, 2, priority=2.0)
            view.prefetch(1, 3, priority=1.0)


@pytest.mark.parametrize(("order", "expected"), [
    # priority: the demand load of expert 1 (layer 1, routed at 1250) jumps the queued guess 3;
    # guess 2 is in flight 1100-2100, then the demand load 2100-3100, compute to 3150
    ("priority", [1150, 3150 - 1150]),
    # fifo: guess 3 was issued first and cannot be reordered: 2100-3100, then demand 3100-4100
    ("fifo", [1150, 4150 - 1150]),
])
def test_fifo_order_puts_a_demand_load_behind_every_issued_prefetch(order: str, expected: list[float]) -> None:
    tr = make_trace([[[0], [1]]], num_experts=4)
    eng, m = run_engine(tr, PrefetchWrong(), tiny_model(2, 4, 1), tiny_hw(), budget_experts=8,
                        pcie_order=order)
    assert step_us(eng) == expected
    assert m["prefetch_gb"] == pytest.approx(2 * MB / 1e9)


def test_fifo_order_never_withdraws_an_issued_copy() -> None:
    class Cancel(PrefetchWrong):
        name = "test-cancel"

        def before_layer(self, view: View, layer: int) -> None:
            if layer == 1:
                self.withdrawn = view.cancel_prefetches()

    tr = make_trace([[[0], [1]]], num_experts=4)
    pri, fifo = Cancel(), Cancel()
    run_engine(tr, pri, tiny_model(2, 4, 1), tiny_hw(), budget_experts=8)
    run_engine(tr, fifo, tiny_model(2, 4, 1), tiny_hw(), budget_experts=8, pcie_order="fifo")
    assert (pri.withdrawn, fifo.withdrawn) == (1, 0)


def test_synchronous_prefetch_makes_the_gpu_wait_before_the_next_layer() -> None:
    # async: layer 1 starts at 1150; sync: it waits for both guesses (2 at 2100, 3 at 3100)
    tr = make_trace([[[0], [2]]], num_experts=4)
    a, _ = run_engine(tr, PrefetchWrong(), tiny_model(2, 4, 1), tiny_hw(), budget_experts=8)
    s, m = run_engine(tr, PrefetchWrong(), tiny_model(2, 4, 1), tiny_hw(), budget_experts=8,
                      sync_prefetch=True)
    assert [round(x.t_start * 1e6) for x in steps(a)] == [0, 1150]
    assert [round(x.t_start * 1e6) for x in steps(s)] == [0, 3100]
    assert step_us(s)[1] == 150   # expert 2 is a hit once the GPU has waited for it
    assert m["sync_prefetch_stall_ms"] == pytest.approx((3100 - 1150) / 1e3)


class OnCpu(LRU):
    """Runs every absent expert on the CPU instead of loading it."""

    name = "test-on-cpu"

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        ex = routing.experts
        cpu = np.array([[view.state(layer, int(e)) == 0 for e in row] for row in ex])
        return Plan(ex, on_cpu=cpu)


def test_an_expert_on_the_cpu_needs_no_transfer_and_the_layer_waits_for_it() -> None:
    # CPU: 3 MB at 1.5 GB/s = 2000 us per expert (+ 0 call cost): routed at 100, done at 2100
    hw = tiny_hw()
    hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"mem_gbps": 1.5, "call_us": 0.0, "tflops": 1000.0})})
    tr = make_trace([[[0]], [[0]]], num_experts=2)
    eng, m = run_engine(tr, OnCpu(), tiny_model(1, 2, 1), hw, budget_experts=1)
    assert step_us(eng) == [100 + 2000, 100 + 2000]
    assert m["cpu_expert_runs"] == 2 and m["h2d_gb"] == 0 and m["accesses"] == 0
    assert m["cpu_wait_ms"] == pytest.approx(4.0) and m["cpu_busy_ms"] == pytest.approx(4.0)


def test_runtime_overhead_is_on_the_critical_path() -> None:
    rt = RuntimeSpec(name="t", layer_us=30, iteration_us=200, token_us=5, source="test")
    tr = make_trace([[[0]], [[0]]], num_experts=2)
    eng, m = run_engine(tr, LRU(), tiny_model(1, 2, 1), tiny_hw(), budget_experts=1, runtime=rt)
    # iteration 0: 100 + 30 (layer) + 1000 + 50, then 200 + 5 per forward pass
    assert [round(x.t_start * 1e6) for x in steps(eng)] == [0, 1180 + 205]
    assert m["runtime_overhead_ms"] == pytest.approx(2 * (30 + 205) / 1e3)


def test_policy_cpu_cost_is_charged_where_it_blocks() -> None:
    class Slow(LRU):
        name = "test-slow"
        decision_us = 40.0

        def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
            view.spend_cpu(25e-6)

    tr = make_trace([[[0]]], num_experts=2)
    eng, m = run_engine(tr, Slow(), tiny_model(1, 2, 1), tiny_hw(), budget_experts=1)
    # 100 attention, 40 decision (routing known at 140), demand 140-1140, compute 1140-1190;
    # the 25 us spent in after_layer delay the compute start (the load still lands at 1140)
    assert round(steps(eng)[0].t_route * 1e6) == 140
    assert step_us(eng) == [1190]
    assert m["policy_cpu_ms"] == pytest.approx(0.065)


def test_random_substitute_runs_the_lossy_path_and_reports_quality_metrics() -> None:
    tr = random_trace(5, layers=2, experts=8, top_k=2, requests=2, decode=10)
    eng, m = run_engine(tr, make_policy("random-substitute"), tiny_model(2, 8, 2), tiny_hw(), budget_experts=6)
    assert m["substitutions_per_token"] > 0
    assert 0 < m["routing_mass_kept"] < 1
    assert m["effective_top_k"] == pytest.approx(2.0)          # substitution keeps the width
    assert 0 < m["top1_agreement"] <= 1
    assert m["misses"] < run_engine(tr, make_policy("lru"), tiny_model(2, 8, 2), tiny_hw(), budget_experts=6)[1]["misses"]


def test_integers_of_one_draws_nothing_as_the_random_planner_assumes() -> None:
    # RandomSubstitutePlanner skips the call when one candidate is left: numpy returns 0 then
    # and leaves the generator (its half-word buffer included) as it was
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    a.integers(3)
    b.integers(3)   # both now hold a buffered half word
    assert int(a.integers(1)) == 0
    assert a.bit_generator.state == b.bit_generator.state
    assert [int(a.integers(5)) for _ in range(9)] == [int(b.integers(5)) for _ in range(9)]


def test_a_bad_plan_is_a_clear_error() -> None:
    class Twice(LRU):
        name = "test-twice"
        lossy = True

        def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
            return Plan(np.array([[1, 1]]))

    class Sneaky(LRU):
        name = "test-sneaky"   # not lossy, yet changes the experts

        def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
            return Plan(np.array([[3, 4]]))

    tr = random_trace(0, layers=1, experts=8, top_k=2)
    with pytest.raises(PolicyError, match="one expert twice"):
        run_engine(tr, Twice(), tiny_model(1, 8, 2), tiny_hw(), budget_experts=4)
    with pytest.raises(PolicyError, match="not lossy"):
        run_engine(tr, Sneaky(), tiny_model(1, 8, 2), tiny_hw(), budget_experts=4)


def test_logits_are_readable_once_routed_and_not_before() -> None:
    class Peek(LRU):
        name = "test-peek"

        def before_layer(self, view: View, layer: int) -> None:
            view.logits(layer)

    tr = random_trace(0)
    with pytest.raises(CausalityError):
        run_engine(tr, Peek(), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)


def test_a_policy_that_needs_a_missing_column_is_refused_at_setup() -> None:
    tr = make_trace([[[0]]], num_experts=2)   # no lookahead logits
    with pytest.raises(PolicySetupError, match="lookahead_logits"):
        run_engine(tr, make_policy("mixtral-offloading", {"predictor": "lookahead"}), tiny_model(1, 2, 1),
                   tiny_hw(), budget_experts=1)
    # auto falls back to the previous token's routing and says so
    _, m = run_engine(tr, make_policy("mixtral-offloading"), tiny_model(1, 2, 1), tiny_hw(), budget_experts=1)
    assert any("lookahead_logits" in w for w in m["warnings"])


def test_the_profile_split_feeds_offline_popularity() -> None:
    tr = random_trace(6, layers=2, experts=8, top_k=2, requests=3)
    prof = profile_from_trace(tr, [0], "request 0")
    seen: list[np.ndarray] = []

    class Probe(LRU):
        name = "test-probe"

        def setup(self, ctx: Context) -> None:
            super().setup(ctx)
            assert ctx.profile is prof
            seen.append(ctx.offline_frequency())

    _, m = run_engine(tr, Probe(), tiny_model(2, 8, 2), tiny_hw(), budget_experts=4, profile=prof)
    expect = np.stack([np.bincount(prof.experts[:, layer, :].reshape(-1), minlength=8) for layer in range(2)])
    np.testing.assert_array_equal(seen[0], expect)
    assert m["warnings"] == []
    # without a profile the replayed requests stand in, with a warning
    _, m2 = run_engine(tr, make_policy("static"), tiny_model(2, 8, 2), tiny_hw(), budget_experts=6)
    assert any("optimistic" in w for w in m2["warnings"])


def test_a_run_result_is_plain_data_that_pickles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.run.runner import run_loaded
    from tests.util import ROOT

    res = run_loaded(load_scenario(ROOT / "scenarios" / "flame-lru.yaml", ["workload.requests=1"]), timeline=True)
    back = pickle.loads(pickle.dumps(res))
    assert back.metrics == res.metrics and back.config == res.config
    np.testing.assert_array_equal(back.steps["t_end"], res.steps["t_end"])
    assert back.timeline == res.timeline


def test_the_config_hash_follows_the_trace_content_not_its_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from moesim.sim.config.scenario import load_scenario_data
    from tests.util import ROOT

    src = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    shutil.copy(src, a)
    shutil.copy(src, b)
    data = {"trace": "a.parquet", "hardware": "rtx-4090", "cache": {"rate": 0.25}, "policy": "lru"}

    def key(trace: str) -> str:
        return load_scenario_data({**data, "trace": trace}, source="t", base_dir=tmp_path).config_hash()

    assert key("a.parquet") == key("b.parquet")
    b.write_bytes(b.read_bytes()[:-1] + b"\0")
    assert key("a.parquet") != key("b.parquet")


def test_the_replay_reads_only_the_columns_the_policy_declares(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import moesim.sim.run.runner as runner
    from moesim.sim.config.scenario import load_scenario
    from tests.util import ROOT

    asked: list[object] = []
    real = runner.read_trace

    def spy(path, columns=None):  # type: ignore[no-untyped-def]
        asked.append(columns)
        return real(path, columns)

    monkeypatch.setattr(runner, "read_trace", spy)
    for policy, want in [("lru", []), ("mixtral-offloading", ["lookahead_logits"]),
                         ("random-substitute", ["weights"])]:
        asked.clear()
        runner.run_loaded(load_scenario(ROOT / "scenarios" / "flame-lru.yaml",
                                        ["workload.requests=1", f"policy={policy}"]))
        assert asked == [want], policy
    assert make_policy("moepic").read_columns() >= {"lookahead_logits"}   # undeclared: reads all
