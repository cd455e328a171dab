"""count_lossy's mass kept (sim/engine/plans.py) takes shortcuts where a sum is exact: they must
give the floats of the plain formula (sums in the weights' own type, numpy's for the whole
row), for every weight type a trace may hold, on plans that keep, substitute and drop."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from moesim.policies.contract.base import Routing
from moesim.sim.engine.plans import count_lossy
from moesim.sim.engine.records import RunStats


def _plain_mass_kept(routed: np.ndarray, plan: np.ndarray, w: np.ndarray | None) -> float:
    total = 0.0
    n, k = routed.shape
    for t in range(n):
        ran = {x for x in plan[t].tolist() if x >= 0}
        wt = w[t] if w is not None else np.ones(k)
        tot = float(wt.sum())
        kept = float(sum(wt[j] for j in range(k) if int(routed[t, j]) in ran))
        total += kept / tot if tot > 0 else 1.0
    return total


@settings(max_examples=300, deadline=None)
@given(k=hs.integers(1, 8), n=hs.integers(1, 3), dtype=hs.sampled_from(["float16", "float32", "float64", "none"]),
       seed=hs.integers(0, 2**32 - 1), wide=hs.booleans())
def test_mass_kept_equals_the_plain_formula(k: int, n: int, dtype: str, seed: int, wide: bool) -> None:
    rng = np.random.default_rng(seed)
    E = 12
    routed = np.stack([rng.choice(E, k, replace=False) for _ in range(n)])
    w = None
    if dtype != "none":
        scale = 10.0 ** rng.integers(-4, 4, size=(n, k)) if wide else 1.0
        w = (rng.random((n, k)) * scale).astype(dtype)
    plan = routed.copy()
    for t in range(n):
        for r in range(k):
            c = rng.random()
            if c < 0.3:
                plan[t, r] = -1
            elif c < 0.6:
                plan[t, r] = rng.choice([x for x in range(E) if x not in plan[t]])
    st = RunStats()
    count_lossy(st, Routing(0, routed, w), plan)
    expected = _plain_mass_kept(routed, plan, w)
    assert repr(st.mass_kept_sum) == repr(0.0 + expected)
    assert st.token_layers == n and dataclasses.asdict(st)["slots_run"] == int((plan >= 0).sum())
