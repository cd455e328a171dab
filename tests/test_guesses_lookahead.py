"""The lookahead predictor's vectorised guesses (:class:`moesim.policies.parts.guesses.GuessMaker`)
against the predictor's own :func:`~moesim.policies.parts.predictors.top_experts`, row by row:
the same experts in the same order and the same scores (float16 and float32 logits' own floats;
float64 ones as float32), on logits full of ties, for top-1 and top-2 (argmax passes) and top-3
and top-4 (a stable sort), finite or not (then sorted too); the trace's logits are left as they
were."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from moesim.policies.parts.guesses import GuessMaker
from moesim.policies.parts.predictors import top_experts


@pytest.mark.parametrize("inf", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lookahead_guesses_are_each_rows_top_experts(dtype: type, k: int, inf: bool) -> None:
    rng = np.random.default_rng(k)
    for levels in (2, 5, 40):   # few levels: many ties
        la = (rng.integers(-levels, levels, size=(60, 8)) / 4).astype(dtype)
        if inf:
            la[int(rng.integers(60)), int(rng.integers(8))] = np.inf
        before = la.copy()
        g = GuessMaker("lookahead", SimpleNamespace(experts=None, lookahead_logits=la), [], 4, 8, k)
        assert g.top_val.dtype == (la.dtype if la.dtype.char in "ef" else np.float32)
        for r in range(len(la)):
            assert (list(zip(g.top_idx[r].tolist(), g.top_val[r].tolist(), strict=True))
                    == top_experts(la[r:r + 1], k)), (levels, r)
        assert np.array_equal(la, before)
