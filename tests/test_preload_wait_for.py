"""Two contract features of issue 25's systems: ``Policy.preload`` (units loaded with the
model, placed before time 0 at no cost) and ``Plan.wait_for`` (copies a layer waits for though
no slot runs them)."""

from __future__ import annotations

import pytest

from moesim.policies.contract.base import Context, Plan, Policy, Routing, UnitKey, View
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.transfers import PolicyError
from tests.util import make_trace, run_engine, steps, tiny_hw, tiny_model

US = 1e-6


class Preloading(Policy):
    """Preloads ``keys``; records what ``warm`` was told."""

    name = "preloading"

    def __init__(self, keys: list[UnitKey]) -> None:
        self.keys = keys
        self.warmed: list[UnitKey] = []

    def preload(self, ctx: Context) -> list[UnitKey]:
        return list(self.keys)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        self.warmed = list(units)


def test_preloaded_units_are_resident_at_time_zero_before_cache_initial() -> None:
    tr = make_trace([[[0], [1]]], num_experts=4)
    pol = Preloading([(1, 1, 0)])
    eng, m = run_engine(tr, pol, tiny_model(2, 4, 1), tiny_hw(), budget_experts=4, initial="popular")
    assert pol.warmed[0] == (1, 1, 0) and len(pol.warmed) == 4   # then cache.initial filled the rest
    # layer 1's expert hits without a copy: 100 + 50 us (layer 0's is placed by cache.initial)
    assert [round(s.t_end / US) for s in steps(eng)] == [150, 300] and m["h2d_gb"] == 0


def test_preloading_more_than_the_budget_is_one_line() -> None:
    tr = make_trace([[[0], [1]]], num_experts=4)
    with pytest.raises(MoesimError, match=r"policy 'preloading' preloads more than the expert budget holds"):
        run_engine(tr, Preloading([(0, 0, 0), (0, 1, 0), (0, 2, 0)]), tiny_model(2, 4, 1), tiny_hw(),
                   budget_experts=4)
    with pytest.raises(MoesimError, match=r"preloads \(0, 9, 0\), which the model does not have"):
        run_engine(tr, Preloading([(0, 9, 0)]), tiny_model(2, 4, 1), tiny_hw(), budget_experts=4)


class Waiting(Policy):
    """Copies expert 3 of each layer and waits for it (or names ``bad`` in wait_for)."""

    name = "waiting"

    def __init__(self, bad: int | None = None, preloaded: tuple[UnitKey, ...] = ()) -> None:
        self.bad = bad
        self.preloaded = preloaded

    def preload(self, ctx: Context) -> list[UnitKey]:
        return list(self.preloaded)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        view.prefetch(layer, 3)
        return Plan(routing.experts.copy(), wait_for=(3,) if self.bad is None else (self.bad,))

    def on_layer_end(self, view: View, layer: int) -> None:
        view.evict(layer, 3)


def test_a_layer_waits_for_the_copies_its_plan_names() -> None:
    tr = make_trace([[[0]]], num_experts=4)
    eng, m = run_engine(tr, Waiting(), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    # attention to 100; expert 3's copy starts at once (100-1100), the demand load of 0 after
    # it (1100-2100), its compute to 2150; nothing waits longer than that here
    assert round(steps(eng)[0].t_end / US) == 2150
    tr2 = make_trace([[[0]]], num_experts=4)
    eng2, _ = run_engine(tr2, Waiting(), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2, pcie_order="fifo")
    assert round(steps(eng2)[0].t_end / US) == 2150
    # with the routed expert loaded with the model, the layer computes it at once (100-150) and
    # then waits for expert 3's copy alone
    eng3, _ = run_engine(tr, Waiting(preloaded=((0, 0, 0),)), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    assert round(steps(eng3)[0].t_end / US) == 1100 and steps(eng3)[0].hits == 1


def test_waiting_for_a_running_or_unknown_expert_breaks_the_contract() -> None:
    tr = make_trace([[[0]]], num_experts=4)
    with pytest.raises(PolicyError, match="waits for expert 0 of layer 0, which a slot of the plan runs"):
        run_engine(tr, Waiting(bad=0), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
    with pytest.raises(PolicyError, match="waits for expert 7 of layer 0, which the model does not have"):
        run_engine(tr, Waiting(bad=7), tiny_model(1, 4, 1), tiny_hw(), budget_experts=2)
