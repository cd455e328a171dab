"""Experts split into parts (``Policy.part_fractions``, MoEpic's segments): the run's per-layer
split changes only between iterations, and only for a layer with no unit present, since the
bytes of every present unit follow from it."""

from __future__ import annotations

from typing import Any

from moesim.sim.engine.state import RunState
from moesim.sim.engine.transfers import PolicyError


def set_fractions(run: RunState[Any], layer: int, fractions: tuple[float, ...]) -> None:
    """Change how the experts of ``layer`` split into parts (no unit of it may be present)."""
    if abs(sum(fractions) - 1.0) > 1e-9 or any(f < 0 for f in fractions):
        raise PolicyError(f"part fractions of layer {layer} must be >= 0 and sum to 1, got {fractions}")
    if fractions != run.fractions[layer] and any(k[0] == layer for k in run.vram.units):
        raise PolicyError(f"layer {layer} changes its split while units are present: evict them first")
    run.fractions[layer] = fractions


def apply_fractions(run: RunState[Any]) -> None:
    """Take the policy's split of every layer (a policy that does not override
    ``part_fractions`` keeps whole experts: nothing to do)."""
    policy = run.policy
    if not policy.uses_hook("part_fractions"):
        return
    for layer in range(run.L):
        fr = tuple(float(f) for f in policy.part_fractions(layer))
        if fr != run.fractions[layer]:
            set_fractions(run, layer, fr)
