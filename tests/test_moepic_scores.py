"""MoEpic's one-token guess scores: read from the view's block softmax (``view.lookahead_probs``) they
are the very floats RowScores computes from the logits row, so a run issues the same priorities."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.moepic.prediction import RowScores, lookahead_guess
from moesim.policies.parts.predictors import softmax_rows


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 40), experts=st.integers(2, 64),
       scale=st.sampled_from([1e-3, 0.5, 4.0, 60.0]), half=st.booleans(), k=st.integers(1, 8))
def test_block_softmax_scores_equal_row_scores(seed: int, rows: int, experts: int, scale: float,
                                               half: bool, k: int) -> None:
    """Every row of a block's softmax gives the scores RowScores computes from that row alone."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, experts)) * scale).astype(np.float16 if half else np.float32)
    block = softmax_rows(logits)
    for i in range(rows):
        one = logits[i:i + 1]
        plain = lookahead_guess(one, k)
        read = lookahead_guess(one, k, block[i:i + 1])
        assert plain is not None and read is not None
        assert plain[0] == read[0] and plain[2] == read[2]
        assert isinstance(read[1], RowScores) and isinstance(plain[1], RowScores)
        assert read[1].get() == plain[1].get()
        assert [read[1][j] for j in range(min(k, experts))] == plain[1].get()


def test_probs_are_read_not_computed() -> None:
    """Given ``probs``, the scores are those numbers (the logits row is not used)."""
    logits = np.array([[0.0, 2.0, 1.0]], dtype=np.float32)
    probs = np.array([[0.25, 0.5, 0.125]], dtype=np.float32)
    guess = lookahead_guess(logits, 2, probs)
    assert guess is not None
    assert guess[0] == [1, 2, 0]
    assert guess[1].get() == [0.5, 0.125]
