"""Every registered policy keeps the contract that :func:`moesim.testing.check_policy` states
(builds with its defaults and stores its parameters, keeps VRAM within the budget, is
deterministic, and unless it is an oracle never reads the future): each of its checks, one
test each; and ``check_policy`` itself fails, naming the rule and the parameter, on policies
that break a rule."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.policies.contract.base import Policy, View
from moesim.policies.contract.registry import (
    PolicyError,
    make_policy,
    policy_class,
    policy_names,
    register,
)
from moesim.policies.parts.caches import LRUCache
from moesim.testing import ConformanceError, check_policy, policy_checks
from tests.util import random_trace, run_engine, tiny_hw, tiny_model

NAMES = policy_names()
CASES = [(name, check) for name in NAMES for check in policy_checks(policy_class(name))]


@pytest.mark.parametrize("name,check", CASES, ids=[f"{n}-{c.id}" for n, c in CASES])
def test_registered_policy_conforms(name: str, check) -> None:  # type: ignore[no-untyped-def]
    check(policy_class(name))


def test_check_policy_runs_every_check_of_a_shipped_policy() -> None:
    check_policy(policy_class("lru"))   # the one-call form a plugin author uses


def test_oracles_are_labelled_as_bounds() -> None:
    oracles = {n for n in NAMES if policy_class(n).oracle}
    assert {"belady", "oracle-prefetch"} <= oracles
    tr = random_trace(4)
    _, m = run_engine(tr, make_policy("belady"), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)
    assert m["bound"] is True


class _Forgets(LRUCache):
    name = "forgets-window"
    summary = "an LRU that does not keep its `window` parameter"

    def __init__(self, *, window: int = 4) -> None:
        super().__init__()
        self._window = window


class _Rounds(LRUCache):
    name = "rounds-rate"
    summary = "an LRU that keeps `rate` rounded"

    def __init__(self, *, rate: float = 0.3) -> None:
        super().__init__()
        self.rate = round(rate, 1)


class _Positional(LRUCache):
    name = "positional"
    summary = "takes a positional parameter"

    def __init__(self, depth: int = 2) -> None:  # a positional parameter: refused
        super().__init__()
        self.depth = depth


class _PeeksAhead(LRUCache):
    name = "peeks-ahead"
    summary = "reads the routing of a layer not yet routed"

    def before_layer(self, view: View, layer: int) -> None:
        if layer + 1 < view.num_layers:
            view.routing(layer + 1)


class _Unseeded(LRUCache):
    name = "unseeded"
    summary = "picks victims from a stream that is not the run's"

    def __init__(self) -> None:
        super().__init__()
        self._rng = np.random.default_rng()

    def victim(self, view, request, candidates):  # type: ignore[no-untyped-def]
        return candidates[int(self._rng.integers(len(candidates)))]


@pytest.mark.parametrize("cls,rule,named", [
    (_Forgets, "stores-parameters", "'window'"),
    (_Rounds, "stores-parameters", "'rate'"),
    (_Positional, "keyword-parameters", "'depth'"),
    (_PeeksAhead, "never-reads-the-future", "CausalityError"),
    (_Unseeded, "same-seed-same-output", "swap_out=False"),
])
def test_check_policy_names_the_broken_rule(cls: type[Policy], rule: str, named: str) -> None:
    with pytest.raises(ConformanceError) as info:
        check_policy(cls)
    assert info.value.rule == rule
    assert named in str(info.value)


def test_parameter_rules_are_checked_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import moesim.testing.conformance as conformance

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started before the parameter rules were checked")

    monkeypatch.setattr(conformance, "run_engine", no_run)
    with pytest.raises(ConformanceError, match="window"):
        check_policy(_Forgets)


def test_a_run_refuses_a_policy_that_does_not_store_a_parameter_with_one_line() -> None:
    register(_Forgets)
    try:
        with pytest.raises(PolicyError, match=r"^policy 'forgets-window' does not store its parameter 'window'"):
            make_policy("forgets-window")
    finally:
        from moesim.policies.contract import registry
        registry._REGISTRY.pop("forgets-window", None)
