"""How ``mixtral-offloading``'s speculative next-layer loads share a per-layer LRU pool of two
experts (Eliseev & Mazur's RTX 3060 setting, k = 2 of Mixtral's top-2): the guessed pair enters
layer ``l + 1``'s pool as its most recent entries, so a wrong pair evicts both of that layer's
residents, which the routed experts then fetch again; plain LRU keeps them and hits."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.policies.contract.registry import make_policy
from moesim.testing.fixtures import EXPERT_BYTES, make_trace, run_engine, tiny_hw, tiny_model
from moesim.traces.format.trace_file import Trace

E = 4


def _guess(first: int, second: int) -> np.ndarray:
    """Lookahead logits that rank ``first``, then ``second``, above the other experts."""
    row = np.zeros(E, dtype=np.float16)
    row[first], row[second] = 2.0, 1.0
    return row


def _trace() -> Trace:
    """Three decode tokens, both layers routed to experts 0 and 1 each time; the guess for
    layer 1 (read after layer 0) is right at tokens 0 and 2 and wrong (2, 3) at token 1."""
    experts = [[[0, 1], [0, 1]]] * 3
    guesses = [(0, 1), (2, 3), (0, 1)]
    lookahead = np.stack([np.stack([_guess(*g), _guess(*g)]) for g in guesses])
    return make_trace(experts, num_experts=E, lookahead=lookahead)


def test_a_wrong_pair_guess_evicts_both_residents_of_a_pool_of_two() -> None:
    # 2 layers x 2 experts of budget: one pool of two per layer. 5 ms of non-MoE time per layer
    # lets every 1 ms copy land before the layer it is for, so timing plays no part.
    model, hw = tiny_model(2, E, 2), tiny_hw(layer_us=5000)
    _, spec = run_engine(_trace(), make_policy("mixtral-offloading", {"predictor": "lookahead"}), model, hw,
                         budget_experts=4)
    _, lru = run_engine(_trace(), make_policy("lru"), model, hw, budget_experts=4)
    def gb(n: int) -> object:
        return pytest.approx(n * EXPERT_BYTES / 1e9, rel=1e-12)

    # token 0: layer 0 misses 0 and 1; the right guess loads layer 1's 0 and 1 (prefetch hits).
    # token 1: layer 0 hits; the guess (2, 3) evicts layer 1's 0 and 1, its least recent, and
    # the routed 0 and 1 miss and evict 2 and 3 unused. token 2: everything hits.
    assert (spec["hits"], spec["misses"], spec["evictions"]) == (8, 4, 4)
    assert spec["prefetch_gb"] == gb(4)
    assert spec["wasted_prefetch_gb"] == gb(2)   # 2 and 3, evicted unused
    assert spec["refetch_gb"] == gb(2)           # 0 and 1 of layer 1, fetched again
    assert spec["demand_gb"] == gb(4)
    # LRU alone: token 0 misses all four, tokens 1 and 2 hit all: half the copies, no eviction
    assert (lru["hits"], lru["misses"], lru["evictions"]) == (8, 4, 0)
    assert lru["h2d_gb"] == gb(4) and spec["h2d_gb"] == gb(8)
