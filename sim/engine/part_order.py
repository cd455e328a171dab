"""Which parts of a layer's experts compute now, as their copies land: the order every replay
(the layer loop, the fast prefetch replay) follows once a layer is routed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from moesim.policies.contract.base import RESIDENT
from moesim.sim.engine.plans import next_in_fixed_order

P = TypeVar("P", bound="tuple[int, float, Any]")
"""A part to compute, as a replay keeps it: (expert index, seconds, something with a ``state``)."""


def early_parts(need: list[P], miss_units: Iterable[object]) -> set[int]:
    """The ids of the parts of ``need`` that were present (resident or issued) when the layer
    was routed: those not among its demand units ``miss_units``."""
    fresh = {id(u) for u in miss_units}
    return {id(x) for x in need if id(x[2]) not in fresh}


def ready_parts(remaining: list[P], early: set[int] | None) -> tuple[list[P], list[P], list[P]]:
    """Experts compute as their parts become resident, ready ones first: of ``remaining``
    (access order), those to compute now, the others (in order), and those whose landing the GPU
    waits for if none is ready. While demand loads wait for room (``early`` given: the
    :func:`early_parts`), one part at a time in the fixed order of
    :func:`~moesim.sim.engine.plans.next_in_fixed_order`, so that the room each frees does not
    depend on when copies land."""
    ready: list[P] = []
    if early is not None:
        head = next_in_fixed_order(remaining, early)
        if head[2].state == RESIDENT:
            return [head], [x for x in remaining if x is not head], [head]
        return ready, remaining, [head]
    rest: list[P] = []
    for x in remaining:
        if x[2].state == RESIDENT:
            ready.append(x)
        else:
            rest.append(x)
    return ready, rest, remaining
