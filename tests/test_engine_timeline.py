"""Exact timelines of the engine on tiny hand-made traces.

Hardware: calibrated costs, layer 100 us, expert 50 us, PCIe 3 GB/s, zero latency, so a 3 MB
expert loads in exactly 1000 us. Every expected figure below is written out by hand.
"""

from __future__ import annotations

import pytest

from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.base import Policy
from moesim.policies.contract.registry import make_policy
from tests.util import make_trace, run_engine, step_us, steps, tiny_hw, tiny_model

MB = 3_000_000  # one expert


def test_demand_misses_follow_the_hand_formula() -> None:
    # layer 0 sees 0, 0, 3; layer 1 sees 1, 2, 2; one expert per layer fits
    tr = make_trace([[[0], [1]], [[0], [2]], [[3], [2]]], num_experts=4)
    model, hw = tiny_model(2, 4, 1), tiny_hw(latency_us=10)
    eng, m = run_engine(tr, LRU(), model, hw, budget_experts=2)
    miss = 100 + 10 + 1000 + 50
    hit = 100 + 50
    assert step_us(eng) == [miss, miss, hit, miss, miss, hit]
    assert m["hits"] == 2 and m["misses"] == 4 and m["accesses"] == 6
    assert m["sim_time_s"] == pytest.approx((4 * miss + 2 * hit) * 1e-6)
    assert m["stall_ms"] == pytest.approx(4 * 1.010)
    assert m["demand_gb"] == pytest.approx(4 * MB / 1e9)
    assert m["expert_vram_peak_gib"] * 2**30 == pytest.approx(2 * MB)


def test_prefetch_that_arrives_early_hides_its_transfer() -> None:
    # the attention window (1500 us) is longer than a transfer (1000 us)
    tr = make_trace([[[0], [1]], [[2], [3]], [[0], [1]]], num_experts=4)
    model, hw = tiny_model(2, 4, 1), tiny_hw(layer_us=1500)
    eng, m = run_engine(tr, make_policy("oracle-prefetch"), model, hw, budget_experts=4)
    first = 1500 + 1000 + 50          # nothing to prefetch from before the first layer
    assert step_us(eng) == [first] + [1550] * 5
    assert m["stall_ms"] == pytest.approx(1.0)
    assert m["misses"] == 1 and m["hits"] == 5


def test_late_prefetch_stalls_for_exactly_the_remainder() -> None:
    # window 600 us < transfer 1000 us; the prefetch of layer 1 waits behind layer 0's demand load
    tr = make_trace([[[0], [1]], [[2], [3]]], num_experts=4)
    model, hw = tiny_model(2, 4, 1), tiny_hw(layer_us=600)
    eng, m = run_engine(tr, make_policy("oracle-prefetch"), model, hw, budget_experts=4)
    # it0 L0: attn 0-600, demand 600-1600, compute -1650; prefetch L1 runs 1600-2600
    # it0 L1: attn 1650-2250, late until 2600 (stall 350), compute -2650
    # prefetch of it1 L0 issued at 2250, lane busy until 2600: lands at 3600
    # it1 L0: attn 2650-3250, stall 350, compute -3650; prefetch it1 L1 lands 4600
    # it1 L1: attn 3650-4250, stall 350, compute -4650
    assert step_us(eng) == [1650, 1000, 1000, 1000]
    assert [round(s.stall_s * 1e6, 6) for s in steps(eng)] == [1000, 350, 350, 350]
    assert m["late"] == 3 and m["misses"] == 1


def test_demand_loads_jump_the_queue_of_prefetches() -> None:
    class PrefetchAll(LRU):
        name = "test-prefetch-all"

        def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
            if view.iteration_index == 0 and layer == 0:
                for e in (1, 2, 3):
                    view.prefetch(1, e)

    tr = make_trace([[[0], [0]]], num_experts=4)
    model, hw = tiny_model(2, 4, 1), tiny_hw()
    eng, _ = run_engine(tr, PrefetchAll(), model, hw, budget_experts=8)
    # the lane starts prefetch (1,1) at 0; demand (0,0) is issued at 100 and goes next, ahead of
    # (1,2) and (1,3): it runs 1000-2000 and computes until 2050. Layer 1 routes at 2150 while
    # (1,2) is in flight (2000-3000); its demand load jumps (1,3) again: 3000-4000, compute -4050
    assert step_us(eng) == [100 + 1900 + 50, 100 + (4000 - 2150) + 50]


class SplitHalf(Policy):
    """Test policy: experts in two halves; keeps only the first half after use."""

    name = "test-split"

    def __init__(self) -> None:
        pass

    def part_fractions(self, layer: int) -> tuple[float, ...]:
        return (0.5, 0.5)

    def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
        for key in view.resident_units():
            if key[2] == 1:
                view.evict(*key)


def test_segments_compute_while_the_rest_loads() -> None:
    tr = make_trace([[[0]], [[0]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw()
    eng, m = run_engine(tr, SplitHalf(), model, hw, budget_experts=1)
    # it0: both halves miss: half 0 lands at 600 and computes 600-625, half 1 lands at 1100
    #      and computes 1100-1125
    # it1: half 0 resident (partial), half 1 loads 500 us while half 0 computes 25 us
    assert step_us(eng) == [1125, 100 + 500 + 25]
    assert (m["misses"], m["partial"], m["hits"]) == (1, 1, 0)
    assert m["demand_gb"] == pytest.approx(1.5 * MB / 1e9)


def test_batched_tokens_share_one_expert_run() -> None:
    # two requests decoded together; both route to expert 0, one of them also to expert 1
    tr = make_trace([[[0, 1]], [[0, 2]]], num_experts=4, requests=[0, 1])
    model, hw = tiny_model(1, 4, 2), tiny_hw(per_token_us=10)
    eng, m = run_engine(tr, LRU(), model, hw, budget_experts=4, batch_size=2)
    # misses 0, 1, 2 load back to back (0-1000 after attn...): loads end at 1100, 2100, 3100;
    # expert 0 runs for two tokens (60 us) at 1100, expert 1 at 2100, expert 2 at 3100
    assert step_us(eng) == [3100 + 50]
    assert m["accesses"] == 3 and m["output_tokens"] == 2
    assert [round(x * 1e6) for x in eng.state.stats.token_end[0]] == [3150]


def test_tight_budget_streams_experts_through_one_slot() -> None:
    tr = make_trace([[[0]], [[1]]], num_experts=4, requests=[0, 1])
    model, hw = tiny_model(1, 4, 1), tiny_hw()
    eng, m = run_engine(tr, LRU(), model, hw, budget_experts=1, batch_size=2)
    # expert 0 loads 100-1100, computes -1150 and unpins; expert 1 evicts it, loads -2150, computes -2200
    assert step_us(eng) == [2200]
    assert m["expert_vram_peak_gib"] * 2**30 == pytest.approx(MB)


def test_eviction_cost_is_paid_inside_a_demand_miss() -> None:
    tr = make_trace([[[0]], [[1]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw(evict_us=30)
    eng, _ = run_engine(tr, LRU(), model, hw, budget_experts=1)
    assert step_us(eng) == [1150, 100 + 30 + 1000 + 50]


def test_transfer_buffer_lets_a_full_cache_load_before_evicting() -> None:
    class Keep(LRU):
        name = "test-keep"

        def choose_victim(self, view, request):  # type: ignore[no-untyped-def]
            if view.layer == 0 and view.iteration_index == 1:
                return request.decline
            return super().choose_victim(view, request)

    tr = make_trace([[[0]], [[1]], [[0]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw()
    eng, m = run_engine(tr, Keep(), model, hw, budget_experts=1, buffer_experts=1)
    # it1: the policy refuses to evict expert 0, so expert 1 loads into the buffer; after use it
    # moves into the cache only if room is made (refused again): it is dropped, 0 stays
    assert m["hits"] == 1 and m["misses"] == 2
    assert m["expert_vram_peak_gib"] * 2**30 == pytest.approx(2 * MB)


def test_budget_below_one_expert_is_a_clear_error() -> None:
    from moesim.sim.core.errors import MoesimError

    tr = make_trace([[[0]]], num_experts=2)
    with pytest.raises(MoesimError, match="at least one expert"):
        run_engine(tr, LRU(), tiny_model(1, 2, 1), tiny_hw(), budget_experts=0.5)


def test_a_demand_load_waits_for_an_in_flight_prefetch_to_land_and_evicts_it() -> None:
    class PrefetchOther(LRU):
        name = "test-prefetch-other"

        def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
            if view.iteration_index == 0:
                view.prefetch(0, 1)   # takes the only slot; in flight 0-1000

    tr = make_trace([[[0]]], num_experts=2)
    eng, m = run_engine(tr, PrefetchOther(), tiny_model(1, 2, 1), tiny_hw(), budget_experts=1)
    # expert 0 is routed at 100 but its pool's only unit is in flight: it waits until the
    # prefetch lands at 1000, evicts it, loads 1000-2000 and computes until 2050
    assert step_us(eng) == [2050]
    assert round(steps(eng)[0].stall_s * 1e6, 6) == 1900   # routed at 100, loaded at 2000
    assert m["wasted_prefetch_gb"] == pytest.approx(MB / 1e9)


def test_a_policy_that_refuses_every_victim_gets_a_clear_error() -> None:
    from moesim.sim.core.errors import MoesimError

    class Refuse(LRU):
        name = "test-refuse"

        def choose_victim(self, view, request):  # type: ignore[no-untyped-def]
            return request.decline

    tr = make_trace([[[0]], [[1]]], num_experts=2)
    with pytest.raises(MoesimError, match="can evict none of them"):
        run_engine(tr, Refuse(), tiny_model(1, 2, 1), tiny_hw(), budget_experts=1)


# -- swap-out over the D2H lane (cache.swap_out): 3 MB copies back in 2000 us at 1.5 GB/s ------

def test_swap_out_puts_the_copy_back_on_the_critical_path_of_a_demand_miss() -> None:
    tr = make_trace([[[0]], [[1]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw(d2h_gbps=1.5)
    eng, m = run_engine(tr, LRU(), model, hw, budget_experts=1, swap_out=True, timeline=True)
    # it1: attention 100, evict expert 0 -> D2H 2000, then H2D 1000, compute 50
    assert step_us(eng) == [1150, 100 + 2000 + 1000 + 50]
    assert m["d2h_gb"] == pytest.approx(MB / 1e9) and m["d2h_busy_ms"] == pytest.approx(2.0)
    d2h = [(round(s * 1e6, 6), round(d * 1e6, 6)) for track, _, s, d, _ in eng.state.timeline if track == "PCIe D2H"]
    assert d2h == [(1250, 2000)]
    # without swap_out the same run only drops the copy
    eng, m = run_engine(tr, LRU(), model, hw, budget_experts=1)
    assert step_us(eng) == [1150, 1150] and m["d2h_gb"] == 0


class PreEvict(LRU):
    """Evicts every unpinned resident of the coming layer before its attention (the shape of
    ActiveEvict's pre-eviction, without its scoring)."""

    name = "test-pre-evict"

    def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
        for key in view.resident_units(view.pool_of(layer)):
            view.evict(*key)


def test_pre_eviction_hides_the_swap_out_behind_attention() -> None:
    tr = make_trace([[[0]], [[1]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw(d2h_gbps=1.5, layer_us=2500)
    eng, _ = run_engine(tr, LRU(), model, hw, budget_experts=1, swap_out=True)
    assert step_us(eng) == [3550, 2500 + 2000 + 1000 + 50]
    eng, _ = run_engine(tr, PreEvict(), model, hw, budget_experts=1, swap_out=True)
    assert step_us(eng) == [3550, 2500 + 1000 + 50]   # the D2H ran during attention


class PrefetchNext(LRU):
    """At the end of iteration 0, prefetch expert 1 of layer 0 (its pool is full of expert 0)."""

    name = "test-prefetch-next"

    def on_iteration_end(self, view):  # type: ignore[no-untyped-def]
        if view.iteration_index == 0:
            assert view.prefetch(0, 1)   # accepted: it waits for expert 0's swap-out


@pytest.mark.parametrize(("layer_us", "expected", "status"), [
    # D2H 4550-6550, prefetch 6550-7550, routed at 8050: a hit
    (3500, [4550, 3500 + 50], "hit"),
    # D2H 3550-5550, prefetch 5550-6550, routed at 6050: late by 500
    (2500, [3550, 2500 + 500 + 50], "late"),
    # D2H 2050-4050; routed at 3050 while still waiting: withdrawn and loaded on demand 4050-5050
    (1000, [2050, 1000 + 1000 + 1000 + 50], "miss"),
])
def test_a_prefetch_waits_for_the_room_its_swap_out_frees(layer_us: float, expected: list[float], status: str) -> None:
    tr = make_trace([[[0]], [[1]]], num_experts=2)
    model, hw = tiny_model(1, 2, 1), tiny_hw(d2h_gbps=1.5, layer_us=layer_us)
    eng, m = run_engine(tr, PrefetchNext(), model, hw, budget_experts=1, swap_out=True)
    assert step_us(eng) == expected
    last = steps(eng)[-1]
    assert (last.hits, last.late, last.misses) == {"hit": (1, 0, 0), "late": (0, 1, 0), "miss": (0, 0, 1)}[status]
    assert m["prefetch_gb"] == pytest.approx(0 if status == "miss" else MB / 1e9)
    assert m["expert_vram_peak_gib"] * 2**30 == pytest.approx(MB)


def test_a_cancelled_prefetch_is_reported_and_leaves_no_cache_bookkeeping() -> None:
    from moesim.policies.baselines.caching import FIFO

    class PrefetchTwoCancelOne(FIFO):
        name = "test-prefetch-cancel"

        def __init__(self) -> None:
            super().__init__()
            self.cancelled: list[tuple[int, int, int]] = []

        def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
            if view.iteration_index == 0:
                for e in (2, 3):   # 2 starts at once on the one lane, 3 queues behind it
                    assert view.prefetch(0, e)
                    self.cache.refresh((0, e, 0))
                assert view.cancel_prefetches() == 1

        def on_cancel(self, view, unit):  # type: ignore[no-untyped-def]
            self.cancelled.append(unit)
            super().on_cancel(view, unit)

    pol = PrefetchTwoCancelOne()
    tr = make_trace([[[0]], [[1]]], num_experts=4)
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), tiny_hw(), budget_experts=4)
    assert pol.cancelled == [(0, 3, 0)]
    assert pol.cache.last_used((0, 3, 0)) == 0 and pol.cache.last_used((0, 2, 0)) > 0
    assert m["prefetch_gb"] == pytest.approx(MB / 1e9)   # only expert 2 was transferred


def test_prefetches_waiting_on_swap_outs_each_claim_their_own_room() -> None:
    class PrefetchTwo(LRU):
        name = "test-prefetch-two"

        def on_iteration_end(self, view):  # type: ignore[no-untyped-def]
            if view.iteration_index == 0:
                assert view.prefetch(0, 2) and view.prefetch(0, 3)

    tr = make_trace([[[0, 1]], [[2, 3]]], num_experts=4)
    model, hw = tiny_model(1, 4, 2), tiny_hw(d2h_gbps=1.5, layer_us=10_000)
    eng, m = run_engine(tr, PrefetchTwo(), model, hw, budget_experts=2, swap_out=True)
    # it0: attention 10000, loads 10000-11000 and 11000-12000, compute to 12050. At its end the
    # first prefetch evicts expert 0 (D2H 12050-14050); the second cannot count on that room,
    # which the first claimed, so it evicts expert 1 (D2H 14050-16050). They load 14050-15050
    # and 16050-17050, long before it1 is routed at 22050: two hits.
    assert step_us(eng) == [12050, 10000 + 50 + 50]
    assert (steps(eng)[1].hits, steps(eng)[1].misses) == (2, 0)
    assert m["evictions"] == 2 and m["prefetch_gb"] == pytest.approx(2 * MB / 1e9)
