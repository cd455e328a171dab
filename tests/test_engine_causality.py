"""The view refuses what a real system would not know yet."""

from __future__ import annotations

import pytest

from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.base import CausalityError
from tests.util import random_trace, run_engine, tiny_hw, tiny_model


class Peeker(LRU):
    """Asks for one thing too early; ``what`` says which."""

    name = "test-peeker"

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self.seen: list[int] = []

    def before_layer(self, view, layer):  # type: ignore[no-untyped-def]
        if self.what == "routing-now":
            view.routing(layer)            # step 2 has not run: unknown
        if self.what == "lookahead-now":
            view.lookahead_logits(layer)

    def after_layer(self, view, layer, outcome):  # type: ignore[no-untyped-def]
        super().after_layer(view, layer, outcome)
        if self.what == "routing-next" and layer + 1 < view.num_layers:
            view.routing(layer + 1)
        if self.what == "allowed":
            # the present and the past are fine
            assert (view.routing(layer).experts == outcome.routing.experts).all()
            assert view.lookahead_logits(layer) is not None
            if layer > 0:
                view.routing(layer - 1)
            self.seen.append(layer)


@pytest.mark.parametrize("what", ["routing-now", "lookahead-now", "routing-next"])
def test_reading_ahead_raises(what: str) -> None:
    with pytest.raises(CausalityError):
        run_engine(random_trace(0), Peeker(what), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)


def test_present_and_past_are_readable() -> None:
    pol = Peeker("allowed")
    run_engine(random_trace(0), pol, tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)
    assert pol.seen[:3] == [0, 1, 2]


def test_only_oracles_get_the_future() -> None:
    from moesim.policies.contract.registry import make_policy, policy_class, policy_names

    for name in policy_names():
        eng, _ = run_engine(random_trace(1), make_policy(name), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)
        assert (eng.state.ctx.future is not None) == policy_class(name).oracle
