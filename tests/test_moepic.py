"""MoEpic: the cache configurator (Algorithm 1, Eqs. 5-11) on hand-made statistics, the
statistics recorder, segment accounting on hand-made traces with exact timelines, the
reconfiguration inside the engine, the degenerate cases, and the paper's baselines.

Hardware of the timelines (tests.util): layer 100 us (or as given), expert 50 us, PCIe 3 GB/s,
no latency: a 3 MB expert loads in 1000 us, a half (theta 0.5) in 500 us and computes in 25 us.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moesim.policies.baselines.adapmoe import allocate_cache_sizes
from moesim.policies.contract.base import HIT, LATE, MISS, PARTIAL
from moesim.policies.contract.registry import make_policy
from moesim.policies.moepic.configurator import (
    CacheConfigurator,
    LayerStats,
    SplitStats,
    Timing,
    solve_layer,
)
from moesim.policies.moepic.policy import MoEpic, split_fractions
from moesim.sim.config.catalog import RuntimeSpec
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.traces.format.schema import PREFILL
from tests.util import make_trace, random_trace, run_engine, step_us, steps, tiny_hw, tiny_model

MB = 3_000_000  # one expert
HALF = MB // 2

# ---------------------------------------------------------------------------------------------
# the configurator on hand-made statistics


def _stats(hit: list[float], pred: list[float], pred_hit: np.ndarray | None = None) -> LayerStats:
    n = len(pred)
    if pred_hit is None:   # the y-th predicted expert is cached with probability C / N
        pred_hit = np.tile(np.arange(n + 1) / n, (n, 1))
    return LayerStats(hit=np.array(hit, dtype=float), pred=np.array(pred, dtype=float), pred_hit=pred_hit)


LAYER = _stats([0, 0.2, 0.9, 0.95, 1.0], [0.5, 0.2, 0.1, 0.05])


def test_solve_layer_picks_the_cache_size_of_eq_11() -> None:
    tm = Timing(t_att=0.5, t_moe=0.4, t_head=0.3, t_load=1.0, top_k=1)
    # window 0.5 < any prefetch (0.75 of a load): m(C) = H(C) * V / C with V = 1:
    # C=1: 0.2, C=2: 0.45, C=3: 0.317, C=4: 0.25 -> C* = 2, theta 0.5
    sp = solve_layer(LAYER, 1.0, 0.5, tm)
    assert (sp.cache_size, sp.theta) == (2, 0.5) and sp.loaded == pytest.approx(0.45)
    # window 0.8: one prefetch fits; it fetches 1 - PH * theta = 0.75 of an expert for every C
    # (PH = C/4), adding 0.75 * P(1) = 0.375 to each m: C=2 still wins with 0.825
    sp = solve_layer(LAYER, 1.0, 0.8, tm)
    assert (sp.cache_size, sp.theta) == (2, 0.5) and sp.loaded == pytest.approx(0.825)
    # budget 1.5: C in [2, 4]; m = H(C) * 1.5 / C: C=2: 0.675 (theta .75), C=3: 0.475, C=4: .375
    sp = solve_layer(LAYER, 1.5, 0.5, tm)
    assert (sp.cache_size, sp.theta) == (2, 0.75) and sp.loaded == pytest.approx(0.675)
    # no budget: whole experts prefetched; two would fit in 2.5, but MoEpic prefetches its K = 1
    # predicted expert only: m = P(1); with K = 2, m = P(1) + P(2)
    sp = solve_layer(LAYER, 0.0, 2.5, tm)
    assert (sp.cache_size, sp.theta) == (0, 0.0) and sp.loaded == pytest.approx(0.5)
    tm2 = Timing(t_att=0.5, t_moe=0.4, t_head=0.3, t_load=1.0, top_k=2)
    assert solve_layer(LAYER, 0.0, 2.5, tm2).loaded == pytest.approx(0.7)
    # with a cache: a window of 3 loads fits three prefetches of 0.75, K = 1 takes one
    assert solve_layer(LAYER, 1.0, 3.0, tm).loaded == pytest.approx(0.825)


def test_expert_split_chains_the_windows_of_eqs_5_to_7() -> None:
    tm = Timing(t_att=0.5, t_moe=0.4, t_head=0.3, t_load=1.0, top_k=1)
    conf = CacheConfigurator(timing=tm, total=2.0)
    res = conf.expert_split([LAYER, LAYER], [1.0, 1.0])
    # layer 1: window 0.3 + 0.5 = 0.8 -> C 2, m 0.825; hide 0.33, miss 0.175, exposed 0
    # layer 2: window 0.4 - min(0.33, 0.175) + 0.5 = 0.725 < 0.75: no prefetch, m 0.45;
    #          hide 0.18, miss 0.55, exposed 0.37
    assert res.window == pytest.approx([0.8, 0.725])
    assert res.exposed == pytest.approx([0.0, 0.37])
    assert res.cache_size.tolist() == [2, 2] and res.theta == pytest.approx([0.5, 0.5])


def _brute_force(conf: CacheConfigurator, stats: list[LayerStats], start: list[float]) -> float:
    step = conf.zeta * conf.total
    n = len(start)
    best = np.inf
    for moves in itertools.product(range(-4, 5), repeat=n - 1):
        shift = list(moves) + [-sum(moves)]
        v = np.array(start) + step * np.array(shift)
        if (v <= 1e-9).any() or (v > stats[0].num_experts + 1e-9).any():
            continue
        best = min(best, float(conf.expert_split(stats, v).exposed.sum()))
    return best


def test_vram_allocation_moves_budget_to_the_layer_that_profits() -> None:
    # no prediction value (P = 0): m_i = H_i(C) * V_i / C. Layer 0 has a linear hit curve
    # (H = 0.1 C: m = 0.1 V whatever C), layer 1 a saturating one (H(1) = .9, H(2) = .95).
    # With t_exp 0 and t_load 1, exposed_i = 1 - m_i. From (2, 2): layer 0 profits 0.1 from
    # one more expert, layer 1 loses only 0.05 from one less -> (3, 1), total 0.8; then no
    # move is feasible (layer 1 would reach 0) and the algorithm stops.
    lin = _stats([0.1 * c for c in range(9)], [0.0] * 8)
    sat = _stats([0, 0.9, 0.95] + [1.0] * 6, [0.0] * 8)
    tm = Timing(t_att=0.5, t_moe=0.0, t_head=0.0, t_load=1.0, top_k=1)
    conf = CacheConfigurator(timing=tm, total=4.0, zeta=0.25)
    alloc = conf.allocate([lin, sat], [2.0, 2.0])
    assert alloc.budgets.tolist() == [3.0, 1.0] and alloc.moves == 1
    assert alloc.total_exposed == pytest.approx(0.8)
    assert alloc.cache_size.tolist() == [3, 1] and alloc.theta.tolist() == [1.0, 1.0]
    assert alloc.total_exposed == pytest.approx(_brute_force(conf, [lin, sat], [2.0, 2.0]))


def test_vram_allocation_reaches_the_lattice_optimum_on_three_layers() -> None:
    rng = np.random.default_rng(3)
    stats = []
    for _ in range(3):   # concave hit curves, some prediction value
        inc = np.sort(rng.uniform(0.0, 0.3, 8))[::-1]
        hit = np.minimum(1.0, np.concatenate([[0.0], np.cumsum(inc)]))
        stats.append(_stats(hit.tolist(), np.sort(rng.uniform(0, 0.4, 8))[::-1].tolist()))
    tm = Timing(t_att=0.6, t_moe=0.3, t_head=0.1, t_load=1.0, top_k=2)
    conf = CacheConfigurator(timing=tm, total=9.0, zeta=1 / 9)
    start = [3.0, 3.0, 3.0]
    alloc = conf.allocate(stats, start)
    assert alloc.budgets.sum() == pytest.approx(9.0)
    assert alloc.total_exposed <= float(conf.expert_split(stats, start).exposed.sum()) + 1e-12
    assert alloc.total_exposed == pytest.approx(_brute_force(conf, stats, start))


def test_split_stats_records_h_p_and_ph() -> None:
    st = SplitStats(1, 3)
    # cache ranks: expert 2 first, then 0, then 1; predicted order 1, 0, 2; expert 0 activated
    st.record(0, np.array([[0]]), np.array([2, 0, 1]), np.array([[1, 0, 2]]))
    ls = st.layer(0)
    assert ls.hit.tolist() == [0, 0, 1, 1]            # rank 1: hits caches of size >= 2
    assert ls.pred.tolist() == [0, 1, 0]              # the 2nd predicted expert ran
    assert ls.pred_hit.tolist() == [[0, 0, 0, 1],     # 1st predicted (expert 1) has rank 2
                                    [0, 0, 1, 1],     # 2nd (expert 0) rank 1
                                    [0, 1, 1, 1]]     # 3rd (expert 2) rank 0


# ---------------------------------------------------------------------------------------------
# segment accounting in the engine


def test_top_segments_cache_and_compute_while_bottoms_load() -> None:
    # one layer, 4 experts, top-1; budget 1 expert = 2 top halves; buffer 1 expert; no prefetch
    tr = make_trace([[[0]], [[0]], [[1]], [[2]], [[0]]], num_experts=4)
    pol = MoEpic(prefetch=False, configurator=False)
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), tiny_hw(), budget_experts=1, buffer_experts=1,
                        timeline=True)
    # it0: both halves miss, land at 600 and 1100 (pool has room), compute 25 each: 1125
    # it1: top cached -> PARTIAL: top computes at once while the bottom loads: 100 + 500 + 25
    # it2: expert 1 misses; its top takes the pool's last half, its bottom is staged: 1125
    # it3: expert 2 misses, both halves staged in the buffer; after use its top replaces the
    #      least-priority top: expert 1 (mu 1) rather than expert 0 (mu 2)
    # it4: expert 0 PARTIAL again
    assert step_us(eng) == [1125, 625, 1125, 1125, 625]
    assert [(s.hits, s.partial, s.misses) for s in steps(eng)] == [
        (0, 0, 1), (0, 1, 0), (0, 0, 1), (0, 0, 1), (0, 1, 0)]
    assert m["demand_gb"] * 1e9 == pytest.approx(3 * MB + 2 * HALF)
    assert m["prefetch_gb"] == 0
    assert sorted(eng.state.vram.units) == [(0, 0, 0), (0, 2, 0)]            # two top segments cached
    assert eng.state.vram.used == [MB] and eng.state.vram.buffer_used == 0
    assert eng.state.stats.vram_peak_bytes == 2 * MB                    # pool full + one staged expert
    # compute split of the partial hit of it1: the top at routing time, the bottom on arrival
    gpu = [(round(t * 1e6), round(d * 1e6)) for lane, _, t, d, _ in eng.state.timeline
           if lane == "GPU" and 1125 < t * 1e6 < 1750]
    assert gpu == [(1125, 100), (1225, 25), (1725, 25)]


def _two_layer_trace(tokens: int) -> object:
    # layer 0 always routes expert 0, layer 1 expert 1; the lookahead router is right
    look = np.zeros((tokens, 2, 4), dtype=np.float16)
    look[:, 0, 1] = 5.0   # router 1 on layer 0's state: expert 1 first, then 0, 2, 3
    look[:, 1, 0] = 5.0   # router 0 on layer 1's state (cross-token): expert 0 first
    return make_trace([[[0], [1]]] * tokens, num_experts=4, lookahead=look)


def test_prefetch_fetches_only_the_bottom_of_a_cached_expert() -> None:
    tr = _two_layer_trace(3)
    pol = MoEpic(configurator=False)
    eng, m = run_engine(tr, pol, tiny_model(2, 4, 1), tiny_hw(layer_us=600), budget_experts=2,
                        buffer_experts=1)
    # it0 L0: nothing predicted yet: both halves of expert 0 miss (600-1100-1600), compute
    #     to 1625. After routing, layer 1's expert 1 is guessed: not cached, so both halves
    #     are prefetched (the buffer holds exactly one expert), 1600-2100-2600.
    # it0 L1: attention 1625-2225; the top landed, the bottom is in flight: LATE, done 2625.
    # from it1 on the tops of experts 0 and 1 are cached and each layer's bottom (500 us) is
    #     prefetched in the 600 us window: every access hits, 600 + 2 * 25 per layer.
    assert step_us(eng) == [1625, 1000, 650, 650, 650, 650]
    assert [(s.hits, s.late, s.misses) for s in steps(eng)] == [
        (0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 0, 0), (1, 0, 0), (1, 0, 0)]
    assert m["demand_gb"] * 1e9 == pytest.approx(MB)
    # prefetched: expert 1 whole, then bottoms only (four used, one for a token that never comes)
    assert m["prefetch_gb"] * 1e9 == pytest.approx(MB + 5 * HALF)
    assert sorted(k for k in eng.state.vram.units if k[2] == 0) == [(0, 0, 0), (1, 1, 0)]


def test_a_right_guess_once_cached_is_no_longer_a_guess() -> None:
    """A guessed top that was right is admitted to the cache (LCP replacement, section 3.3); a
    later token of the layer that routes elsewhere must not evict it as a wrong guess (it did,
    leaving the pool part-empty)."""
    look = np.zeros((4, 2, 4), dtype=np.float16)
    look[[0, 1, 2, 3], 0, [1, 2, 3, 1]] = 5.0   # router 1 on layer 0: right, right, right, wrong
    look[:, 1, 0] = 5.0                         # router 0 on layer 1: expert 0 (right)
    tr = make_trace([[[0], [1]], [[0], [2]], [[0], [3]], [[0], [2]]], num_experts=4, lookahead=look)
    eng, _ = run_engine(tr, MoEpic(configurator=False), tiny_model(2, 4, 1), tiny_hw(layer_us=2000),
                        budget_experts=2, buffer_experts=1)
    # layer 1 guesses experts 1, 2, 3 whole (1000 us in a 2000 us window): each a hit, its top
    # admitted; two tops fit, so 3's top replaces 1's (LCP) and 2's stays. Token 3 routes 2: its
    # top is cached, a partial hit whose bottom loads on demand: 2000 + 500 + 25
    assert [(s.hits, s.partial, s.misses) for s in steps(eng)][1::2] == [(1, 0, 0)] * 3 + [(0, 1, 0)]
    assert step_us(eng)[7] == 2525
    assert sorted(k for k, u in eng.state.vram.units.items() if k[0] == 1 and not u.in_buffer) == [(1, 2, 0), (1, 3, 0)]


def test_prefetch_covers_exactly_the_top_k_predicted_experts() -> None:
    """Section 3.2: the prefetch for a layer is its K predicted (activated) experts in
    descending score, each as its bottom when its top is cached, else whole; nothing past the
    K-th prediction, even with buffer room for every expert of the layer."""
    look = np.zeros((2, 2, 8), dtype=np.float16)
    look[0, 0, [3, 5, 1, 0]] = [5, 4, 3, 2]     # layer 1 of token 0: 3, 5, then 1, 0, ...
    look[1, 0, [3, 6, 2, 7]] = [5, 4, 3, 2]     # layer 1 of token 1: 3, 6, then 2, 7, ...
    look[:, 1, [0, 1, 4]] = [5, 4, 3]           # layer 0 of the next token: 0, 1, then 4
    tr = make_trace([[[0, 1], [3, 5]], [[0, 1], [3, 6]]], num_experts=8, lookahead=look)
    model = tiny_model(2, 8, 2)
    wl = build_workload(tr, batch_size=1, phases=("decode",))
    eng = Engine(wl, MoEpic(configurator=False), CostModel(model, tiny_hw(layer_us=10_000)),
                 budget_bytes=2 * model.expert_bytes, buffer_bytes=8 * model.expert_bytes,
                 check_invariants=True)
    issued: dict[int, set[tuple[int, int, int]]] = {}
    issue = eng.state.transfers.issue_prefetch

    def spy(key: tuple[int, int, int], priority: float, into_buffer: bool) -> bool:
        ok = issue(key, priority, into_buffer)
        if ok:
            issued.setdefault(eng.state.cur_iter.index, set()).add(key)
        return ok

    eng.state.transfers.issue_prefetch = spy   # type: ignore[method-assign]
    eng.run()
    # token 0: nothing cached in layer 1: experts 3 and 5 whole (both halves); after layer 1 the
    # tops of 0 and 1 (layer 0) and of 3 and 5 (layer 1) are cached, so the next token's layer 0
    # gets the bottoms of 0 and 1. Token 1: layer 1's expert 3 has its top cached (bottom only),
    # expert 6 does not (whole); then layer 0 of a token that never comes: bottoms of 0 and 1.
    assert issued == {0: {(1, 3, 0), (1, 3, 1), (1, 5, 0), (1, 5, 1), (0, 0, 1), (0, 1, 1)},
                      1: {(1, 3, 1), (1, 6, 0), (1, 6, 1), (0, 0, 1), (0, 1, 1)}}
    assert [(s.hits, s.misses) for s in steps(eng)] == [(0, 2), (2, 0), (2, 0), (2, 0)]


def test_statuses_of_segmented_accesses() -> None:
    tr = make_trace([[[0]], [[0]]], num_experts=2)
    eng, m = run_engine(tr, MoEpic(prefetch=False, configurator=False), tiny_model(1, 2, 1), tiny_hw(),
                        budget_experts=1, buffer_experts=1)
    statuses = [(s.hits, s.late, s.partial, s.misses) for s in steps(eng)]
    assert statuses == [(0, 0, 0, 1), (0, 0, 1, 0)]
    assert m["partial_rate"] == 0.5 and m["hit_rate"] == 0.0
    assert (HIT, LATE, PARTIAL, MISS) == (0, 1, 2, 3)


def test_random_start_caches_the_tops_of_v_over_theta_experts() -> None:
    """Algorithm 1, line 4 and section 3.4.2: MoEpic starts from a uniform budget, theta 0.5
    and a random cache, i.e. the top segments of V_i / theta = 2 random experts in a budget of
    one expert (the fill places first parts before second parts), not one whole expert whose
    bottom is then dropped (which left half the budget empty)."""
    tr = make_trace([[[2]]], num_experts=4)
    eng, m = run_engine(tr, MoEpic(prefetch=False, configurator=False), tiny_model(1, 4, 1), tiny_hw(),
                        budget_experts=1, buffer_experts=1, initial="random")
    # seed 0 places the tops of experts 2 and 0 (the random order starts 2, 0): expert 2 is a
    # partial hit, its top computes at once while the bottom loads: 100 + 500 + 25
    assert [(s.partial, s.misses) for s in steps(eng)] == [(1, 0)]
    assert step_us(eng) == [625]
    assert m["demand_gb"] * 1e9 == pytest.approx(HALF)
    assert sorted(eng.state.vram.units) == [(0, 0, 0), (0, 2, 0)] and eng.state.vram.used == [MB]


def test_theta_rises_to_v_over_n_when_v_over_theta_exceeds_the_layer() -> None:
    """Eq. 11: theta_i = V_i / C_i with C_i <= N. A budget of 3 experts in a layer of 4 cannot
    hold 6 tops of half an expert: theta starts at 3/4 and the start caches the 4 tops (3 MB)."""
    tr = make_trace([[[1]]], num_experts=4)
    pol = MoEpic(prefetch=False, configurator=False)
    eng, m = run_engine(tr, pol, tiny_model(1, 4, 1), tiny_hw(), budget_experts=3, buffer_experts=1,
                        initial="random")
    assert pol.part_fractions(0) == (0.75, 0.25)
    assert [(s.partial, s.misses) for s in steps(eng)] == [(1, 0)]
    assert m["demand_gb"] * 1e9 == pytest.approx(MB // 4)
    assert sorted(eng.state.vram.units) == [(0, e, 0) for e in range(4)] and eng.state.vram.used == [3 * MB]


def test_prefill_keeps_the_cached_tops_and_streams_the_rest_through_the_buffer() -> None:
    """Section 4.2: in the prefill every expert of a layer is routed; MoEpic computes the cached
    tops while the missing segments load (through the buffer of one expert), and keeps the tops
    cached: 2 partial hits and 2 misses move 6 halves (3 MB), not the 4 whole experts that
    dropping the cached tops would move."""
    tr = make_trace([[[0]], [[1]], [[2]], [[3]]], num_experts=4, phases=[PREFILL] * 4)
    eng, m = run_engine(tr, MoEpic(prefetch=False, configurator=False), tiny_model(1, 4, 1), tiny_hw(),
                        budget_experts=1, buffer_experts=1, phases=("prefill", "decode"), initial="random",
                        timeline=True)
    # the random start holds the tops of experts 0 and 2 (seed 0)
    # 0-100 attention; the tops of 0 and 2 compute at 100 and 125 while E0.1, E1.0, E1.1, E2.1,
    # E3.0, E3.1 load back to back (500 us each, 100-3100); each computes as it lands; the
    # last at 3100-3125
    assert step_us(eng) == [3125]
    s = steps(eng)[0]
    assert (s.hits, s.partial, s.misses) == (0, 2, 2)
    assert m["demand_gb"] * 1e9 == pytest.approx(3 * MB)
    gpu = [(round(t * 1e6), round(d * 1e6)) for lane, _, t, d, _ in eng.state.timeline if lane == "GPU"]
    assert gpu[:3] == [(0, 100), (100, 25), (125, 25)]
    loads = [ev[1] for ev in eng.state.timeline if ev[0].startswith("PCIe")]
    assert loads == ["L0 E0.1", "L0 E1.0", "L0 E1.1", "L0 E2.1", "L0 E3.0", "L0 E3.1"]
    # no cached top was evicted for a passing bottom: the pool still holds two tops (the tops of
    # the two misses replaced the cached ones by LCP on admission)
    assert sorted(eng.state.vram.units) == [(0, 2, 0), (0, 3, 0)]
    assert eng.state.vram.used == [MB] and eng.state.stats.evictions == 2


# ---------------------------------------------------------------------------------------------
# reconfiguration inside the engine


def test_reconfiguration_installs_budgets_splits_and_the_top_c_experts() -> None:
    tr = random_trace(11, layers=3, experts=8, top_k=2, requests=2, prompt=2, decode=30)
    model = tiny_model(3, 8, 2)
    pol = MoEpic(tau=10)
    eng, m = run_engine(tr, pol, model, tiny_hw(layer_us=300), budget_experts=9, buffer_experts=2)
    assert len(pol.applied) >= 4
    last = pol.applied[-1]
    total = 9 * model.expert_bytes
    assert sum(eng.state.vram.capacity) <= total and last.budgets.sum() == pytest.approx(9.0)
    for layer in range(3):
        theta, c = float(last.theta[layer]), int(last.cache_size[layer])
        fr = eng.state.fractions[layer]
        assert fr == pol.part_fractions(layer)
        assert fr[0] == pytest.approx(theta, abs=1e-6)
        tops = [k for k in eng.state.vram.units if k[0] == layer and k[2] == 0 and not eng.state.vram.units[k].in_buffer]
        assert len(tops) <= c
        assert eng.state.vram.used[layer] <= eng.state.vram.capacity[layer]
    assert eng.state.stats.vram_peak_bytes <= total + 2 * model.expert_bytes
    assert m["hits"] + m["late"] + m["partial"] + m["misses"] == m["accesses"]


def test_the_configurator_is_what_the_policy_runs() -> None:
    tr = random_trace(12, layers=3, experts=8, top_k=2, requests=1, prompt=1, decode=24)
    pol = MoEpic(tau=10_000)   # never reconfigures by itself
    run_engine(tr, pol, tiny_model(3, 8, 2), tiny_hw(layer_us=300), budget_experts=9, buffer_experts=2)
    assert not pol.applied
    alloc = pol.configuration()
    assert alloc.budgets.sum() == pytest.approx(9.0)
    assert (alloc.theta > 0).all() and (alloc.theta <= 1).all()


def test_the_configurator_times_windows_on_the_engine_clock() -> None:
    """T_comp^att and T_comp^head (Algorithm 1's inputs) as the engine spends them: a layer's
    non-MoE part plus the runtime's per-layer overhead, the head plus its per-forward-pass
    overhead; so the first window (line 30) is their sum."""
    tr = random_trace(12, layers=3, experts=8, top_k=2, requests=1, prompt=1, decode=8)
    rt = RuntimeSpec(name="rt", layer_us=300, iteration_us=1000, token_us=200)
    pol = MoEpic(tau=10_000)
    run_engine(tr, pol, tiny_model(3, 8, 2), tiny_hw(layer_us=100), budget_experts=9, buffer_experts=2,
               runtime=rt)
    assert pol.timing is not None
    assert (pol.timing.t_att, pol.timing.t_head) == pytest.approx((400e-6, 1200e-6))
    assert (pol.timing.t_moe, pol.timing.t_load) == pytest.approx((100e-6, 1000e-6))
    assert pol.configuration().split.window[0] == pytest.approx(1600e-6)


@pytest.mark.parametrize("params", [{"speculative": False}, {"cache_policy": "random"},
                                    {"configurator": False}, {"tau": 7, "cache_policy": "random"},
                                    {"tau": 7, "speculative": False}, {"tau": 7, "prefetch": False}])
def test_ablations_run_within_budget_and_deterministically(params: dict[str, object]) -> None:
    tr = random_trace(13, layers=3, experts=8, top_k=2, requests=2, decode=16)
    model = tiny_model(3, 8, 2)
    runs = [run_engine(tr, make_policy("moepic", params), model, tiny_hw(layer_us=300), budget_experts=6,
                       buffer_experts=2, phases=("prefill", "decode"), seed=3) for _ in range(2)]
    assert runs[0][1] == runs[1][1]
    assert runs[0][0].state.stats.vram_peak_bytes <= 8 * model.expert_bytes


def test_degenerate_cases() -> None:
    tr = random_trace(14, layers=3, experts=8, top_k=1, requests=2, decode=16)
    model, hw = tiny_model(3, 8, 1), tiny_hw()
    # prefetch only: nothing stays in the pools; all that is left at the end is the guess for
    # layer 0 of a token that never comes, in the transfer buffer
    eng, m = run_engine(tr, make_policy("moepic-prefetch-only"), model, hw, budget_experts=3, buffer_experts=1)
    assert sum(eng.state.vram.used) == 0 and m["prefetch_gb"] > 0
    assert all(u.in_buffer and k[0] == 0 for k, u in eng.state.vram.units.items())
    # cache only = the LCP demand cache: the victim chosen after the load (on admission) is
    # the one LCP chooses before it (one token's update scales every priority alike)
    cache_only, m1 = run_engine(tr, make_policy("moepic-cache-only"), model, hw, budget_experts=6,
                                buffer_experts=1)
    lcp, m2 = run_engine(tr, make_policy("lcp"), model, hw, budget_experts=6)
    assert [s.hits for s in steps(cache_only)] == [s.hits for s in steps(lcp)]
    assert m1["prefetch_gb"] == 0 and m1["hits"] == m2["hits"]


def test_split_fractions_and_bad_parameters() -> None:
    assert split_fractions(0.5) == (0.5, 0.5)
    assert split_fractions(1.0) == (1.0,) and split_fractions(0.0) == (1.0,)
    for params in ({"theta": 1.5}, {"zeta": 0.0}, {"tau": 0}, {"cache_policy": "lru"}, {"rho": 0.0}):
        with pytest.raises(ValueError):
            make_policy("moepic", params)


# ---------------------------------------------------------------------------------------------
# baselines


def test_adapmoe_dynamic_programme_is_optimal() -> None:
    rng = np.random.default_rng(5)
    costs = np.sort(rng.uniform(0, 1, (3, 5)), axis=1)[:, ::-1]   # cost falls with cache size
    sizes = allocate_cache_sizes(costs, 6, minimum=1)
    best = min((costs[0, a] + costs[1, b] + costs[2, c], (a, b, c))
               for a, b, c in itertools.product(range(1, 5), repeat=3) if a + b + c <= 6)
    assert sizes.sum() <= 6 and tuple(sizes.tolist()) == best[1]


def test_adapmoe_reallocates_within_the_budget() -> None:
    tr = random_trace(15, layers=3, experts=8, top_k=2, requests=2, decode=20)
    model = tiny_model(3, 8, 2)
    pol = make_policy("adapmoe", {"realloc_tokens": 8})
    eng, _ = run_engine(tr, pol, model, tiny_hw(), budget_experts=9, buffer_experts=2)
    assert pol.sizes and all(int(s.sum()) <= 9 for s in pol.sizes)   # type: ignore[attr-defined]
    assert sum(eng.state.vram.capacity) <= 9 * model.expert_bytes


def test_moe_infinity_prefetches_from_the_matching_activation_matrix() -> None:
    # requests A and C route differently; B repeats A. With A and C in the collection, B's
    # first token matches A after layer 0 and prefetches A's expert of layer 1 (a cache of one
    # expert per layer, holding C's, could not have it)
    a, c = [[1], [2], [3]], [[4], [5], [6]]
    tr = make_trace([a, a, c, c, a], num_experts=8, requests=[0, 0, 1, 1, 2])
    eng, m = run_engine(tr, make_policy("moe-infinity"), tiny_model(3, 8, 1), tiny_hw(), budget_experts=3)
    first_b = [s for s in steps(eng) if s.iteration == 4]
    assert [(s.hits, s.late, s.misses) for s in first_b] == [(0, 0, 1), (0, 1, 0), (0, 1, 0)]
    assert m["prefetch_gb"] * 1e9 == pytest.approx(2 * MB)


def test_pregated_prefetches_the_next_layer_and_keeps_nothing() -> None:
    tr = _two_layer_trace(3)
    eng, m = run_engine(tr, make_policy("pregated"), tiny_model(2, 4, 1), tiny_hw(layer_us=600),
                        budget_experts=4)
    # layer 0 has no pre-gate: a demand load every token; layer 1's expert is prefetched when
    # layer 0 routes, behind layer 0's demand load, and arrives late; nothing stays after use
    assert [(s.hits, s.late, s.misses) for s in steps(eng)] == [(0, 0, 1), (0, 1, 0)] * 3
    assert not eng.state.vram.units and m["prefetch_gb"] * 1e9 == pytest.approx(3 * MB)


def test_pool_splits_install_an_allocation_in_whole_bytes() -> None:
    from moesim.policies.moepic.configurator import Allocation, LayerSplit, SplitResult, pool_splits

    splits = [LayerSplit(loaded=0.0, cache_size=0, theta=0.0),     # nothing cached: whole experts stream
              LayerSplit(loaded=0.0, cache_size=3, theta=1.0),     # whole experts cached
              LayerSplit(loaded=0.0, cache_size=4, theta=0.5)]     # 4 tops of half an expert
    alloc = Allocation(budgets=np.array([0.0, 3.0, 2.0]),
                       split=SplitResult(exposed=np.zeros(3), window=np.zeros(3), splits=splits), moves=0)
    caps, fracs, thetas = pool_splits(alloc, 1000, 5000)
    assert caps == [0, 3000, 2000] and fracs == [(1.0,), (1.0,), (0.5, 0.5)] and thetas == [0.0, 1.0, 0.5]
    # a budget of 1.001 experts over 3 tops: 333 bytes each (theta rounded to whole bytes), and a
    # total a byte short of the pools taken off the largest
    splits = [LayerSplit(loaded=0.0, cache_size=3, theta=1.001 / 3)]
    alloc = Allocation(budgets=np.array([1.001]),
                       split=SplitResult(exposed=np.zeros(1), window=np.zeros(1), splits=splits), moves=0)
    caps, fracs, thetas = pool_splits(alloc, 1000, 998)
    assert caps == [998] and thetas == [0.333] and fracs == [(0.333, 1.0 - 0.333)]
