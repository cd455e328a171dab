"""fMoE's cheaper computations give the numbers of the plain ones they stand for, on random inputs:
the mass rule's NaN test (``select_floats``: a sum instead of a loop, the numpy reading when it is
NaN) and the trajectory match (``ExpertMapStore.trajectory``: the plain quotient where no norm is
zero, computed in place)."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from moesim.policies.fmoe.expert_maps import ExpertMapStore, _select_by_mass_np, select_floats

prob = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan]))


def bits(picked: list[tuple[int, float]]) -> list[tuple[int, bytes]]:
    """The picks with each probability's bytes (NaN compares equal to NaN)."""
    return [(e, struct.pack("<d", p)) for e, p in picked]


@given(vals=st.lists(prob, min_size=1, max_size=12), delta=st.floats(-0.5, 1.5), k=st.integers(1, 4),
       dynamic=st.booleans())
def test_select_floats_is_the_numpy_reading(vals: list[float], delta: float, k: int, dynamic: bool) -> None:
    """The Python mass rule and numpy's (its definition) pick the same experts in the same order."""
    with np.errstate(all="ignore"):
        want = _select_by_mass_np(np.asarray(vals), delta, k, dynamic)
    assert bits(select_floats(list(vals), delta, k, dynamic)) == bits(want)


def trajectory_afresh(store: ExpertMapStore, layer: int, dots: np.ndarray, traj_sq: float) -> tuple[int, float]:
    """Eq. 5 as first written: new arrays, the quotient made safe where a norm is zero."""
    den = np.sqrt(store._prefix_t[layer, : store.n] * traj_sq)
    cs = np.divide(dots, den, out=np.zeros_like(dots), where=den > 0)
    y = int(cs.argmax())
    return y, float(cs[y])


@given(n=st.integers(1, 9), seed=st.integers(0, 2 ** 32 - 1), zero=st.booleans(), scale=st.sampled_from([1e-200, 1.0, 1e200]))
def test_trajectory_is_the_safe_quotient(n: int, seed: int, zero: bool, scale: float) -> None:
    """Every layer's match, twice in a row, as computed afresh with the quotient made safe; zero
    rows and norms that overflow or underflow included."""
    rng = np.random.default_rng(seed)
    store = ExpertMapStore(16, 3, 4, 1)
    for i in range(n):
        emap = rng.random((3, 4)) * (0.0 if zero and i == 0 else 1.0)
        store.insert(rng.random(2), emap)
    for layer in range(3):
        dots = rng.random(store.n) * scale
        tsq = float(rng.random()) * scale
        with np.errstate(all="ignore"):
            want = trajectory_afresh(store, layer, dots, tsq)
            for _ in range(2):
                y, s = store.trajectory(layer, dots.copy(), tsq)
                assert y == want[0] and struct.pack("<d", s) == struct.pack("<d", want[1])
