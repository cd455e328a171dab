"""Hypothesis properties of the engine over random tiny traces, budgets and policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moesim.policies.contract.registry import make_policy, policy_names
from tests.util import random_trace, run_engine, steps, tiny_hw, tiny_model

SETTINGS = settings()   # examples, seed and deadline from the profile (tests/conftest.py)

case = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000),
    "layers": st.integers(1, 3),
    "experts": st.integers(2, 8),
    "k": st.integers(1, 3),
    "batch": st.integers(1, 3),
    "budget": st.integers(1, 10),
    "buffer": st.integers(0, 2),
    "copy_engines": st.integers(1, 2),
    "policy": st.sampled_from(policy_names()),
    "swap_out": st.booleans(),
    "serial": st.booleans(),
    "order": st.sampled_from(["priority", "fifo"]),
    "sync": st.booleans(),
})


@SETTINGS
@given(case)
# found by CI: a one-expert pool, top-2 and split experts (the computed top segment must make
# room for its bottom); and a miss whose top was in flight loads only its bottom
@example({"seed": 0, "layers": 1, "experts": 2, "k": 2, "batch": 1, "budget": 1, "buffer": 0,
          "copy_engines": 1, "policy": "moepic", "swap_out": False, "order": "priority", "sync": False})
@example({"seed": 0, "layers": 2, "experts": 2, "k": 2, "batch": 1, "budget": 1, "buffer": 2,
          "copy_engines": 2, "policy": "moepic", "swap_out": False, "order": "priority", "sync": False})
def test_invariants_hold_for_any_policy_and_budget(c: dict) -> None:  # type: ignore[type-arg]
    k = min(c["k"], c["experts"])
    tr = random_trace(c["seed"], layers=c["layers"], experts=c["experts"], top_k=k, requests=3,
                      prompt=2, decode=4)
    model = tiny_model(c["layers"], c["experts"], k)
    hw = tiny_hw(copy_engines=c["copy_engines"])
    budget = max(c["budget"], c["layers"])  # at least one expert per layer
    eng, m = run_engine(tr, make_policy(c["policy"]), model, hw, budget_experts=budget,
                        buffer_experts=c["buffer"], batch_size=c["batch"], phases=("prefill", "decode"),
                        swap_out=c["swap_out"], serial_swap=c.get("serial", False), pcie_order=c["order"],
                        sync_prefetch=c["sync"])
    # VRAM never exceeds budget + buffer (the peak is taken at every allocation)
    assert eng.state.stats.vram_peak_bytes <= (budget + c["buffer"]) * model.expert_bytes
    # one access or CPU run per (iteration, layer, distinct expert executed)
    expected = sum(len(np.unique(tr.experts[it.rows0 + layer]))
                   for it in eng.state.workload.iterations for layer in range(c["layers"]))
    assert m["accesses"] == m["hits"] + m["late"] + m["partial"] + m["misses"]
    if not eng.state.policy.lossy:   # a lossy plan may run other experts than the routed ones
        # (an expert a plan runs on the CPU is a CPU run, not a GPU access: cpu-moe, fiddler)
        assert m["accesses"] + m["cpu_expert_runs"] == expected
    # time only moves forward, and the GPU cannot be busier than the clock
    for s in steps(eng):
        assert s.t_start <= s.t_route <= s.t_end and s.stall_s >= 0
    assert all(a.t_end <= b.t_start + 1e-12 for a, b in zip(steps(eng), steps(eng)[1:], strict=False))
    assert eng.state.stats.gpu_busy_s <= m["sim_time_s"] + 1e-9
    # demand loads are exactly the parts absent when routing was known: misses (nothing
    # resident) and partials (a segment resident) load at least one part, hits and late ones none
    whole = all(fr == (1.0,) for fr in eng.state.fractions)   # no policy split its experts (at the end)
    for s in steps(eng):
        loads = s.misses + s.partial
        assert (s.demand_bytes > 0) == (loads > 0)
        assert s.demand_bytes <= loads * model.expert_bytes
        if whole and s.partial == 0:
            assert s.demand_bytes == loads * model.expert_bytes
    assert m["demand_gb"] * 1e9 == pytest.approx(sum(s.demand_bytes for s in steps(eng)), abs=1)
    # prefetches waiting for draining room claim exactly their bytes
    claims = [0] * len(eng.state.vram.claimed)
    for u, _ in eng.state.transfers.waiting_prefetch:
        claims[u.pool] += u.nbytes
    assert eng.state.vram.claimed == claims and all(d >= 0 for d in eng.state.vram.draining)
    # swap-out copies back only what was loaded, and only when asked to
    assert m["d2h_gb"] <= m["h2d_gb"] + 1e-12 if c["swap_out"] else m["d2h_gb"] == 0


@SETTINGS
@given(st.integers(0, 10_000), st.integers(1, 6))
def test_lru_hit_rate_never_drops_when_the_cache_grows(seed: int, size: int) -> None:
    # LRU's stack property: with one pool per layer, a bigger cache holds a superset
    tr = random_trace(seed, layers=2, experts=10, top_k=2, requests=2, prompt=0, decode=12)
    model, hw = tiny_model(2, 10, 2), tiny_hw()
    hits = [run_engine(tr, make_policy("lru"), model, hw, budget_experts=2 * c)[1]["hits"]
            for c in (size + 1, size + 2)]
    assert hits[0] <= hits[1]


@SETTINGS
@given(st.integers(0, 10_000), st.floats(0.5, 50.0))
def test_more_bandwidth_never_slows_no_cache(seed: int, gbps: float) -> None:
    tr = random_trace(seed, layers=2, experts=6, top_k=2, requests=1, prompt=0, decode=5)
    model = tiny_model(2, 6, 2)
    slow = run_engine(tr, make_policy("no-cache"), model, tiny_hw(pcie_gbps=gbps), budget_experts=4)[1]
    fast = run_engine(tr, make_policy("no-cache"), model, tiny_hw(pcie_gbps=gbps * 2), budget_experts=4)[1]
    assert fast["sim_time_s"] < slow["sim_time_s"]
