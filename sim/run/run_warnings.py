"""Warnings the run itself raises about its set-up (no silent fallbacks): a budget that the
per-layer pools cannot use in full, TTFT without a prefill, a policy mechanism that never
acted. They join the policy's own warnings in the summary and ``metrics.json``."""

from __future__ import annotations

from typing import Any

from moesim.sim.config.catalog import GIB, ModelSpec
from moesim.sim.config.scenario import LoadedScenario
from moesim.sim.engine.state import RunState


def budget_warning(run: RunState[Any], model: ModelSpec, budget: int, key: str) -> str | None:
    """Per-layer pools hold whole units: with whole experts, a budget of 1.7 experts per layer
    runs as 1 (``gib: 12`` and ``gib: 18`` run alike on Mixtral). Say so, with the idle bytes."""
    if run.global_pool or any(fr != (1.0,) for fr in run.fractions):
        return None
    eb = model.expert_bytes
    per_layer = budget // model.num_layers
    usable = per_layer // eb
    idle = (per_layer - usable * eb) * model.num_layers
    if idle < 0.01 * eb * model.num_layers:
        return None
    return (f"cache.{key}: the budget is {per_layer / eb:.2f} experts per layer, but each layer's pool holds "
            f"whole experts: {usable} per layer are used and {idle / GIB:.2f} GiB stay idle (any budget from "
            f"{usable} to {usable + 1} experts per layer runs alike); give cache.experts_per_layer: {usable} or "
            f"{usable + 1}")


def run_warnings(loaded: LoadedScenario, run: RunState[Any], model: ModelSpec, budget: int) -> list[str]:
    """Every warning of the run's set-up and of its policy's mechanisms (see the module)."""
    out: list[str] = []
    w = budget_warning(run, model, budget, loaded.scenario.cache.given)
    if w:
        out.append(w)
    if "prefill" not in loaded.scenario.workload.phases:
        out.append("TTFT is the time to the first decoded token: the workload replays no prefill "
                   "(workload.phases: [decode]), so no prompt processing is in it")
    out.extend(run.policy.final_warnings())
    return out
