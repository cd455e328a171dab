"""BuddyMoE's one-row shortcuts agree exactly with the array code they stand in for."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.buddymoe.coactivation import buddy_lists, buddy_row, conditional
from moesim.policies.buddymoe.tae import surely_positive, tae


@settings(max_examples=200, deadline=None)
@given(E=st.integers(2, 12), hi=st.integers(0, 6), seed=st.integers(0, 2**31),
       alpha=st.sampled_from([0.3, 0.5, 0.9, 0.95, 1.0, 1 / 3]), k_max=st.integers(1, 12))
def test_buddy_row_is_buddy_lists_row(E: int, hi: int, seed: int, alpha: float, k_max: int) -> None:
    # integer (binary-profile) counts, symmetric, zero diagonal; activations with ties and zeros
    rng = np.random.default_rng(seed)
    M = rng.integers(0, hi + 1, size=(1, E, E)).astype(float)
    M = M + M.transpose(0, 2, 1)
    M[0][np.arange(E), np.arange(E)] = 0.0
    A = rng.integers(0, 3, size=(1, E)).astype(float)
    lists = buddy_lists(conditional(M, 0.0), A, alpha, k_max)
    acts = A[0].tolist()
    assert [buddy_row(M[0, i].tolist(), acts, i, alpha, k_max) for i in range(E)] == lists[0]


def test_buddy_row_hand_made() -> None:
    # q(1|0) = 3/5, q(2|0) = 2/5: alpha 0.5 keeps 1; alpha 0.9 keeps both; never active: none
    counts, acts = [0.0, 3.0, 2.0, 0.0], [5.0, 3.0, 2.0, 0.0]
    assert buddy_row(counts, acts, 0, 0.5, 4) == [1]
    assert buddy_row(counts, acts, 0, 0.9, 4) == [1, 2]
    assert buddy_row(counts, acts, 0, 0.9, 1) == [1]
    assert buddy_row(counts, [0.0, 3.0, 2.0, 0.0], 0, 0.9, 4) == []
    assert buddy_row([0.0] * 4, acts, 0, 0.9, 4) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-1.0, 1e6), st.sampled_from([0.0, 1.0, 1e-300, float("nan"), float("inf")])),
                min_size=1, max_size=6))
def test_surely_positive_only_when_the_tae_is_positive(row: list[float]) -> None:
    if surely_positive(row):
        assert tae(np.asarray([row]))[0] > 0


def test_surely_positive_cases() -> None:
    assert surely_positive([0.6, 0.4]) and surely_positive([0.5, 0.0, 0.5])
    assert not surely_positive([1.0, 0.0]) and not surely_positive([1.0, -0.5])
    assert not surely_positive([1.0, float("nan")]) and not surely_positive([1.0, 1e-250])
