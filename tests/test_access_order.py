"""access_order's one-hot path (many slots, few experts: a batched prefill) gives exactly what
its sorting path gives: the experts by first occurrence and their token counts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.sim.engine.plans import access_order


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), experts=st.integers(1, 80), slots=st.integers(1, 600))
def test_the_one_hot_path_equals_the_sort(seed: int, experts: int, slots: int) -> None:
    rng = np.random.default_rng(seed)
    valid = rng.integers(0, experts, size=slots).astype(np.int16)
    got = access_order(valid, experts)
    uniq, first, cnt = np.unique(valid, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    assert got == ([int(x) for x in uniq[order]], [int(x) for x in cnt[order]])
    assert got == access_order(valid)
    assert all(type(x) is int for x in got[0] + got[1])
