"""The one hook order of the contract (moesim.policies.contract.base), proved on a tiny case: every hook
the engine calls, with its moment in simulated time, written out by hand.

Hardware: layer 100 us, expert 50 us, a 3 MB expert loads in 1000 us. Two MoE layers, three
experts, top-1, one expert per layer. Iteration 0 routes 0 then 1, iteration 1 routes 2 then 1.
After layer 0 of iteration 0 the policy prefetches expert 2 of layer 1 (a wrong guess).
"""

from __future__ import annotations

from typing import Any

from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    Plan,
    Routing,
    UnitKey,
    VictimChoice,
    View,
)
from tests.util import make_trace, run_engine, tiny_hw, tiny_model


class Recorder(LRU):
    """LRU that writes down every hook call: (microseconds, hook, details)."""

    name = "test-recorder"

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[Any, ...]] = []

    def _at(self, view: View | None, *what: Any) -> None:
        t = -1 if view is None else round(view.now * 1e6)
        self.log.append((t, *what))

    def setup(self, ctx: Context) -> None:
        self._at(None, "setup")
        super().setup(ctx)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        self._at(view, "warm", tuple(units))
        super().warm(view, units)

    def on_iteration_start(self, view: View) -> None:
        self._at(view, "on_iteration_start", view.iteration_index)

    def before_layer(self, view: View, layer: int) -> None:
        self._at(view, "before_layer", layer)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        self._at(view, "on_routed", layer, int(routing.experts[0, 0]))
        return None

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        self._at(view, "on_access", layer, tuple(outcome.experts), tuple(outcome.status))
        super().on_access(view, layer, outcome)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        self._at(view, "after_layer", layer)
        if view.iteration_index == 0 and layer == 0:
            assert view.prefetch(1, 2)

    def on_layer_end(self, view: View, layer: int) -> None:
        self._at(view, "on_layer_end", layer)

    def on_iteration_end(self, view: View) -> None:
        self._at(view, "on_iteration_end", view.iteration_index)

    def choose_victim(self, view: View, request: EvictionRequest) -> VictimChoice:
        answer = super().choose_victim(view, request)
        self._at(view, "choose_victim", request.reason.value, request.unit, answer)
        return answer

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        self._at(view, "on_loaded", unit, demand)

    def on_evict(self, view: View, unit: UnitKey) -> None:
        self._at(view, "on_evict", unit)
        super().on_evict(view, unit)

    def on_cancel(self, view: View, unit: UnitKey) -> None:
        self._at(view, "on_cancel", unit)
        super().on_cancel(view, unit)


def test_hooks_are_called_in_contract_order() -> None:
    tr = make_trace([[[0], [1]], [[2], [1]]], num_experts=3)
    pol = Recorder()
    run_engine(tr, pol, tiny_model(2, 3, 1), tiny_hw(), budget_experts=2)
    HIT, LATE, MISS = 0, 1, 3
    assert pol.log == [
        (-1, "setup"),
        (0, "warm", ()),
        (0, "on_iteration_start", 0),
        (0, "before_layer", 0),
        (100, "on_routed", 0, 0),
        (100, "on_access", 0, (0,), (MISS,)),          # demand load of expert 0 issued: 100-1100
        (100, "after_layer", 0),                       # prefetch (1, 2) queues behind it
        (1100, "on_loaded", (0, 0, 0), True),
        (1150, "on_layer_end", 0),                     # expert 0 computed 1100-1150
        (1150, "before_layer", 1),                     # prefetch of (1, 2) in flight 1100-2100
        (1250, "on_routed", 1, 1),
        # layer 1 routes expert 1: its only slot holds the prefetch in flight; it waits for it
        (1250, "on_access", 1, (1,), (MISS,)),
        (1250, "after_layer", 1),
        (2100, "on_loaded", (1, 2, 0), False),
        (2100, "choose_victim", "demand", (1, 1, 0), (1, 2, 0)),
        (2100, "on_evict", (1, 2, 0)),                 # the wrong guess leaves unused
        (3100, "on_loaded", (1, 1, 0), True),
        (3150, "on_layer_end", 1),
        (3150, "on_iteration_end", 0),
        (3150, "on_iteration_start", 1),
        (3150, "before_layer", 0),
        (3250, "on_routed", 0, 2),
        (3250, "choose_victim", "demand", (0, 2, 0), (0, 0, 0)),
        (3250, "on_evict", (0, 0, 0)),
        (3250, "on_access", 0, (2,), (MISS,)),
        (3250, "after_layer", 0),
        (4250, "on_loaded", (0, 2, 0), True),
        (4300, "on_layer_end", 0),
        (4300, "before_layer", 1),
        (4400, "on_routed", 1, 1),
        (4400, "on_access", 1, (1,), (HIT,)),
        (4400, "after_layer", 1),
        (4450, "on_layer_end", 1),
        (4450, "on_iteration_end", 1),
    ]
    assert LATE == 1   # the status codes used above

