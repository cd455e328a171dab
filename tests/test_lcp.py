"""LCP (MoEpic Eq. 4): the priority formula, and the mechanism on a hand-made access string
where it behaves like LFU early (a frequent expert survives a burst) and like LRU later (the
stale frequent expert decays out), next to LRU and LFU."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.policies.baselines.lcp import LCP
from moesim.policies.contract.registry import make_policy
from moesim.policies.parts.lcp_priority import CachePriority
from tests.util import make_trace, random_trace, run_engine, steps, tiny_hw, tiny_model


def test_priority_is_mu_times_rho_to_the_nu_over_omega() -> None:
    cp = CachePriority(1, 3, rho=0.25, omega=128)
    for e in (0, 0, 1):
        cp.observe(0, np.array([[e]]))
    # three tokens: expert 0 at tokens 0 and 1, expert 1 at token 2, expert 2 never
    assert cp.mu[0].tolist() == [2, 1, 0]
    assert cp.interval(0).tolist() == [1, 0, 3]
    assert cp.priorities(0) == pytest.approx([2 * 0.25 ** (1 / 128), 1.0, 0.0])
    assert cp.ranking(0).tolist() == [0, 1, 2]


def test_many_token_iteration_counts_every_token_in_order() -> None:
    cp = CachePriority(1, 4, rho=0.5, omega=1)
    cp.observe(0, np.array([[0, 1], [0, 2], [3, -1]]))   # a prefill of three tokens, top-2
    assert cp.mu[0].tolist() == [2, 1, 1, 1]
    # clock 3; last activations at tokens 1, 0, 1, 2
    assert cp.interval(0).tolist() == [1, 2, 1, 0]
    assert cp.priorities(0) == pytest.approx([2 * 0.5, 1 * 0.25, 1 * 0.5, 1.0])


def test_rho_one_is_history_lfu() -> None:
    cp = CachePriority(1, 3, rho=1.0, omega=128)
    for e in (2, 2, 2, 0, 1, 1):
        cp.observe(0, np.array([[e]]))
    assert cp.priorities(0).tolist() == [1.0, 2.0, 3.0]
    assert cp.victim([(0, 0, 0), (0, 1, 0), (0, 2, 0)]) == (0, 0, 0)


ACCESSES = [0, 0, 0, 1, 2, 0, 3, 2, 3, 2, 3, 2]


def _hit_positions(policy: object) -> list[int]:
    tr = make_trace([[[e]] for e in ACCESSES], num_experts=4)
    eng, m = run_engine(tr, policy, tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    assert m["accesses"] == len(ACCESSES)
    return [s.iteration for s in steps(eng) if s.hits]


def test_lcp_keeps_the_frequent_expert_then_lets_it_decay() -> None:
    # omega = 2 tokens, so the decay shows within a dozen tokens. By hand, cache of 2:
    # t4 (expert 2): P0 = 3 * .25^(1/2) = 1.5 > P1 = 1     -> evict 1 (LRU would evict 0)
    # t5: 0 hits. t6 (3): P0 = 4, P2 = .5 -> evict 2. t7 (2): P0 = 4 * .25^(1/2) = 2 > P3 = 1
    # -> evict 3. t8 (3): P0 = 4 * .25 = 1 < P2 = 2 -> evict 0; then 2 and 3 hit to the end
    assert _hit_positions(LCP(rho=0.25, omega=2)) == [1, 2, 5, 9, 10, 11]


def test_lru_and_lfu_on_the_same_string() -> None:
    # LRU loses expert 0 to the burst (misses t5) but follows the 2/3 phase (hits t8..t11)
    assert _hit_positions(make_policy("lru")) == [1, 2, 8, 9, 10, 11]
    # LFU (in-cache counts) keeps expert 0 forever and thrashes 2 and 3 in the other slot
    assert _hit_positions(make_policy("lfu")) == [1, 2, 5]


def test_lcp_with_the_paper_window_is_lru_like_on_short_strings() -> None:
    # omega = 128: over a dozen tokens the decay is weak, so frequency dominates like LFU,
    # but mu is the whole history (not the in-cache count): expert 0 stays as LFU's did
    assert _hit_positions(make_policy("lcp")) == [1, 2, 5]


def test_lcp_is_deterministic_and_counts_on_a_random_trace() -> None:
    tr = random_trace(5, layers=3, experts=8, top_k=2, requests=2, decode=12)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    a = run_engine(tr, make_policy("lcp"), model, hw, budget_experts=9)[1]
    b = run_engine(tr, make_policy("lcp"), model, hw, budget_experts=9)[1]
    assert a == b
    assert a["hits"] + a["misses"] == a["accesses"]


@pytest.mark.parametrize("params", [{"rho": 0.0}, {"rho": 1.5}, {"omega": 0}])
def test_bad_parameters_are_errors(params: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        make_policy("lcp", params)
