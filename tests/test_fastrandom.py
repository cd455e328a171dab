"""The Random rule's decider's bounded draws (policies/parts/deciders/draws.py) against numpy's ``Generator.integers``:
the same values and the same generator state after, whatever the bounds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from moesim.policies.parts.deciders.draws import Draws, exact_draws


@settings(max_examples=200, deadline=None)
@given(seed=hs.integers(0, 2**32), warmup=hs.integers(0, 3),
       bounds=hs.lists(hs.one_of(hs.integers(1, 70), hs.integers(1, 2**32 - 1)), max_size=60))
def test_draws_equal_integers(seed: int, warmup: int, bounds: list[int]) -> None:
    ref = np.random.default_rng(seed)
    mine = np.random.default_rng(seed)
    for _ in range(warmup):   # leave PCG64's half-word buffer full or empty
        ref.integers(7)
        mine.integers(7)
    d = Draws(mine)
    assert [int(ref.integers(n)) for n in bounds] == [d.draw(n) for n in bounds]
    d.close()
    assert ref.bit_generator.state == mine.bit_generator.state
    assert ref.integers(1000, size=4).tolist() == mine.integers(1000, size=4).tolist()


def test_only_pcg64_is_emulated() -> None:
    assert exact_draws(np.random.default_rng(0))
    assert not exact_draws(np.random.Generator(np.random.MT19937(0)))
