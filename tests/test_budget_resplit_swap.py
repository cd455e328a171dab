"""Re-splitting the per-layer budgets (``set_layer_budgets``) while evicted bytes still drain
back to the host (``cache.swap_out``): the shrinking pool keeps that room until its copies
land, the growing pools get it then, and no more than the total budget is ever held.

Hand-made trace for AdapMoE (no prefetch, so that only the cache decides): two layers of four
experts, one per token, a budget of four experts (two per layer at the start), re-planned after
six tokens. Layer 0 routes 0, 1, then 0 only (hit rates 3/6 at one expert, 4/6 at two); layer 1
cycles 0, 1, 2 (hits only at three). The programme gives (1, 3): layer 0, holding 0 and 1, must
shrink to one expert, so AdapMoE evicts expert 1 (the least recently used) before shrinking it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.baselines.adapmoe import AdapMoE
from moesim.policies.contract.base import RESIDENT
from moesim.policies.contract.registry import make_policy
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.vram import Unit, Vram, VramError
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import EXPERT_BYTES as MB
from tests.util import (
    assert_same_replays,
    make_trace,
    random_trace,
    run_engine,
    steps,
    tiny_hw,
    tiny_model,
)

LAYER0 = [0, 1, 0, 0, 0, 0, 0, 0]
LAYER1 = [0, 1, 2, 0, 1, 2, 0, 1]


def _run(swap_out: bool) -> tuple[AdapMoE, Engine, dict[str, Any]]:
    tr = make_trace([[[a], [b]] for a, b in zip(LAYER0, LAYER1, strict=True)], num_experts=4)
    pol = make_policy("adapmoe", {"realloc_tokens": 6, "prefetch_experts": 0})
    assert isinstance(pol, AdapMoE)
    eng, m = run_engine(tr, pol, tiny_model(2, 4, 1), tiny_hw(), budget_experts=4, swap_out=swap_out)
    return pol, eng, m


@pytest.mark.parametrize("swap_out", [False, True])
def test_adapmoe_shrinks_a_full_layer_after_evicting_its_surplus(swap_out: bool) -> None:
    pol, eng, m = _run(swap_out)
    assert [s.tolist() for s in pol.sizes] == [[1, 3]]   # type: ignore[attr-defined]
    vram = eng.state.vram
    assert vram.capacity == [MB, 3 * MB] and vram.reserved == [0, 0] and vram.owed == [0, 0]
    hits = [(s.iteration, s.layer, s.hits, s.misses) for s in steps(eng)]
    # layer 1 misses every token of its cycle at two experts (four evictions, tokens 2-5), and
    # the re-plan evicts layer 0's expert 1 (the fifth)
    assert hits[:12] == [(0, 0, 0, 1), (0, 1, 0, 1), (1, 0, 0, 1), (1, 1, 0, 1)] + [
        (t, layer, int(layer == 0), int(layer == 1)) for t in range(2, 6) for layer in (0, 1)]
    if not swap_out:
        # at three experts layer 1 loads expert 0 into the new room and then hits expert 1
        assert hits[12:] == [(6, 0, 1, 0), (6, 1, 0, 1), (7, 0, 1, 0), (7, 1, 1, 0)]
        assert m["evictions"] == 5 and m["d2h_gb"] == 0.0
    else:
        # expert 1's copy back (1000 us) still runs when token 6 reaches layer 1: the room layer 1
        # grows into is not free yet, so its miss evicts (expert 1, the least recent), and token
        # 7 misses expert 1; every eviction copies its 3 MB back
        assert hits[12:] == [(6, 0, 1, 0), (6, 1, 0, 1), (7, 0, 1, 0), (7, 1, 0, 1)]
        assert m["evictions"] == 6 and m["d2h_gb"] * 1e9 == pytest.approx(6 * MB)


def _resident(vram: Vram, layer: int, expert: int) -> Unit:
    u = Unit((layer, expert, 0), MB, layer, demand=True)
    assert vram.take_room(u, allow_buffer=False)
    vram.add(u)
    vram.landed(u)
    return u


def _drain(vram: Vram, u: Unit) -> None:
    vram.remove(u)
    vram.start_drain(u)


def test_a_shrinking_pool_gives_its_draining_room_to_the_growing_pools_as_it_lands() -> None:
    vram = Vram([2 * MB, 2 * MB, 2 * MB], buffer_bytes=0)
    a, b = _resident(vram, 0, 0), _resident(vram, 0, 1)
    _resident(vram, 1, 0)
    _drain(vram, a)
    _drain(vram, b)
    # pool 0 holds nothing but drains two experts; it shrinks to 0, pools 1 and 2 grow to 3
    vram.set_capacities([0, 3 * MB, 3 * MB], total=6 * MB)
    # the total has room for one of them only: the first in pool order waits for what drains
    # (down to what it holds), the other grows at once
    assert vram.capacity == [2 * MB, MB, 3 * MB]
    assert vram.reserved == [2 * MB, 0, 0] and vram.claimed == [2 * MB, 0, 0] and vram.owed == [0, 2 * MB, 0]
    assert vram.room_to_come(0) == 0 and vram.free(1) == 0 and vram.free(2) == 3 * MB
    vram.end_drain(a)
    assert vram.capacity == [MB, 2 * MB, 3 * MB] and vram.reserved == [MB, 0, 0] and vram.owed == [0, MB, 0]
    vram.check()
    vram.end_drain(b)
    assert vram.capacity == [0, 3 * MB, 3 * MB] and vram.reserved == [0, 0, 0] and vram.owed == [0, 0, 0]
    assert vram.claimed == [0, 0, 0] and vram.used == [0, MB, 0]
    vram.check()


def test_a_new_split_while_a_shrink_is_under_way_starts_afresh() -> None:
    vram = Vram([2 * MB, 2 * MB], buffer_bytes=0)
    a = _resident(vram, 0, 0)
    _resident(vram, 0, 1)
    _drain(vram, a)
    vram.set_capacities([MB, 3 * MB], total=4 * MB)
    assert vram.capacity == [2 * MB, 2 * MB] and vram.owed == [0, MB]
    vram.set_capacities([2 * MB, 2 * MB], total=4 * MB)   # back to the old split: nothing waits
    assert vram.capacity == [2 * MB, 2 * MB] and vram.reserved == [0, 0] and vram.owed == [0, 0]
    assert vram.claimed == [0, 0]
    vram.end_drain(a)
    assert vram.capacity == [2 * MB, 2 * MB] and vram.used == [MB, 0]
    vram.check()


def test_a_split_the_pools_cannot_hold_is_an_engine_bug() -> None:
    vram = Vram([2 * MB, 2 * MB], buffer_bytes=0)
    a = _resident(vram, 0, 0)
    _resident(vram, 0, 1)
    _resident(vram, 1, 0)
    _resident(vram, 1, 1)
    _drain(vram, a)
    with pytest.raises(VramError, match="over the total"):   # the caller's check was skipped
        vram.set_capacities([MB, 3 * MB], total=3 * MB)


def test_moepic_reconfigures_with_swap_out() -> None:
    # MoEpic's reconfiguration evicts what it no longer keeps, then re-splits: with swap_out
    # those bytes still drain (the engine refused this split before); the invariant holds
    # after every step (run_engine checks it)
    tr = random_trace(15, layers=3, experts=8, top_k=2, requests=2, decode=20)
    pol = make_policy("moepic", {"tau": 8})
    eng, m = run_engine(tr, pol, tiny_model(3, 8, 2), tiny_hw(), budget_experts=9, buffer_experts=2, swap_out=True)
    assert len(pol.applied) == 5   # type: ignore[attr-defined]
    assert sum(eng.state.vram.capacity) <= 9 * MB and eng.state.vram.owed == [0, 0, 0]
    assert (m["evictions"], eng.state.stats.d2h_bytes) == (137, 461_385_006)   # golden counts
    assert all(u.state == RESIDENT for u in eng.state.vram.units.values())


@pytest.mark.parametrize("policy, params", [("adapmoe", {"realloc_tokens": 8}), ("moepic", {"tau": 8})])
def test_the_event_loop_and_the_fast_driver_shrink_alike(policy: str, params: dict[str, int]) -> None:
    tr = random_trace(15, layers=3, experts=8, top_k=2, requests=2, decode=20)
    model = tiny_model(3, 8, 2)
    runs = []
    for fast in (None, FAST_PATH):
        eng = Engine(build_workload(tr, batch_size=1, phases=("decode",)), make_policy(policy, params),
                     CostModel(model, tiny_hw()), budget_bytes=9 * MB, buffer_bytes=2 * MB, swap_out=True,
                     check_invariants=True, fast_replay=fast)
        eng.run()
        runs.append((eng, compute_metrics(eng.state)))
    (slow, ms), (quick, mf) = runs
    assert (ms["engine_path"], mf["engine_path"]) == ("event", "fast")
    assert_same_replays(slow, ms, quick, mf)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(3, 12), period=st.integers(2, 10),
       policy=st.sampled_from(["adapmoe", "moepic"]), serial=st.booleans())
def test_re_splits_under_swap_out_keep_the_invariant(seed: int, budget: int, period: int, policy: str,
                                                      serial: bool) -> None:
    """Any re-split under swap_out: the VRAM invariant after every step (run_engine checks it),
    never more than the budget in the pools, and a finished shrink leaves nothing reserved or owed."""
    tr = random_trace(seed, layers=3, experts=6, top_k=2, requests=2, decode=12)
    params = {"realloc_tokens": period} if policy == "adapmoe" else {"tau": period}
    eng, _ = run_engine(tr, make_policy(policy, params), tiny_model(3, 6, 2), tiny_hw(), budget_experts=budget,
                        buffer_experts=2, swap_out=True, serial_swap=serial)
    vram = eng.state.vram
    assert sum(vram.capacity) <= budget * MB
    if not vram.draining_any():
        assert vram.reserved == [0, 0, 0] and vram.owed == [0, 0, 0]
