"""``View.probs`` and ``View.lookahead_probs``: the softmax of the logits and of the lookahead
logits, made a block of trace rows at a time by the engine's view, is byte for byte
``softmax_rows`` of each token's own rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moesim.sim.engine.view as view_module
from moesim.policies.baselines.caching import LRU
from moesim.policies.parts.predictors import softmax_rows
from moesim.traces.format.trace_file import Trace
from tests.util import make_trace, random_trace, run_engine, tiny_hw, tiny_model


def with_logits(tr: Trace) -> Trace:
    """``tr`` with router logits (float32, from its lookahead: any logits will do)."""
    L, E = tr.model.num_layers, tr.model.num_experts
    T = tr.num_rows // L
    assert tr.lookahead_logits is not None
    look = tr.lookahead_logits.reshape(T, L, E)
    return make_trace(tr.experts.reshape(T, L, -1), num_experts=E, requests=tr.request_id[::L].tolist(),
                      phases=tr.phase[::L].tolist(), lookahead=look, weights=tr.weights.reshape(T, L, -1),
                      logits=np.roll(look, 1, axis=1).astype(np.float32) * 1.5)


class ProbsReader(LRU):
    """Compares, after every layer, the view's probabilities with the softmax of its logits."""

    name = "test-probs-reader"

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0
        self.read_only = 0

    def after_layer(self, view, layer, outcome):  # type: ignore[no-untyped-def]
        super().after_layer(view, layer, outcome)
        for probs, logits in ((view.lookahead_probs(layer), view.lookahead_logits(layer)),
                              (view.probs(layer), view.logits(layer))):
            assert logits is not None   # random_trace writes both
            want = softmax_rows(logits)
            assert probs.dtype == want.dtype and probs.shape == want.shape
            assert probs.tobytes() == want.tobytes()
            self.checked += 1
            self.read_only += not probs.flags.writeable


@pytest.mark.parametrize("block", [1, 2, 5, 256])
@pytest.mark.parametrize("batch", [1, 3])
def test_view_probs_equal_the_softmax_of_the_logits(monkeypatch: pytest.MonkeyPatch, block: int,
                                                         batch: int) -> None:
    monkeypatch.setattr(view_module, "PROBS_BLOCK", block)
    tr = with_logits(random_trace(3, layers=4, experts=8, requests=3, decode=7))
    pol = ProbsReader()
    run_engine(tr, pol, tiny_model(4, 8, 2), tiny_hw(), budget_experts=8, batch_size=batch,
               phases=("prefill", "decode"))
    assert pol.checked > 0
    if batch == 1:
        assert pol.read_only > 0   # decode tokens read the block


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 40), experts=st.integers(1, 70), dtype=st.sampled_from(["float16", "float32", "float64"]),
       scale=st.sampled_from([0.01, 1.0, 30.0, 3000.0]), seed=st.integers(0, 2**32 - 1))
def test_a_row_in_a_block_is_the_row_alone(rows: int, experts: int, dtype: str, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, experts)) * scale).astype(dtype)
    block = softmax_rows(x)
    for r in range(rows):
        assert block[r:r + 1].tobytes() == softmax_rows(x[r:r + 1]).tobytes()


SPECIAL = st.one_of(st.floats(width=16, allow_nan=False, allow_infinity=False),
                    st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan]))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(SPECIAL, min_size=8, max_size=8), min_size=1, max_size=6),
       dtype=st.sampled_from(["float16", "float32"]))
def test_a_row_with_nan_inf_or_signed_zeros_in_a_block_is_the_row_alone(rows: list[list[float]], dtype: str) -> None:
    x = np.array(rows, dtype=dtype)
    with np.errstate(all="ignore"):
        block = softmax_rows(x)
        for r in range(len(rows)):
            assert block[r:r + 1].tobytes() == softmax_rows(x[r:r + 1]).tobytes()
