"""Run a scenario end to end: resolve the trace, model, hardware, budget and policy, build the
workload, run the engine and compute the metrics. Used by ``simctl run``, sweeps, notebooks
and tests alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moesim.policies.registry import make_policy
from moesim.sim.catalog import GIB, HardwareSpec, ModelSpec
from moesim.sim.cost import CostModel
from moesim.sim.engine import Engine
from moesim.sim.metrics import compute_metrics
from moesim.sim.scenario import LoadedScenario, ScenarioError
from moesim.sim.workload import build_workload
from moesim.traces.format import Trace, read_trace, trace_from_columns


@dataclass
class RunResult:
    """Everything a run produced: the resolved config, the metrics and the engine (for its
    per-step records and timeline)."""

    config: dict[str, Any]
    metrics: dict[str, Any]
    engine: Engine
    model: ModelSpec
    hardware: HardwareSpec


def load_trace(loaded: LoadedScenario) -> Trace:
    """The scenario's trace: a validated file, or generated from ``{synthetic: {...}}``."""
    path = loaded.trace_path()
    if path is not None:
        return read_trace(path)
    from moesim.traces.synthetic import SynthParams, generate  # generator only when asked for

    spec = loaded.scenario.trace
    assert isinstance(spec, dict)
    try:
        params = SynthParams.model_validate(spec["synthetic"])
    except Exception as exc:  # pydantic ValidationError: keep it to one line
        errs = getattr(exc, "errors", None)
        if callable(errs):
            e0 = errs()[0]
            loc = ".".join(str(x) for x in e0.get("loc", ()))
            msg = "unknown key" if e0.get("type") == "extra_forbidden" else e0.get("msg")
            raise ScenarioError(f"{loaded.source or 'scenario'}: trace.synthetic.{loc}: {msg}") from None
        raise ScenarioError(f"{loaded.source or 'scenario'}: trace.synthetic: {exc}") from None
    columns, meta = generate(params)
    return trace_from_columns(columns, meta)


def check_shapes(trace: Trace, model: ModelSpec, source: str) -> None:
    tm = trace.model
    if (tm.num_layers, tm.num_experts, tm.top_k) != (model.num_layers, model.num_experts, model.top_k):
        raise ScenarioError(
            f"{source}: model {model.name!r} has {model.num_layers} MoE layers x {model.num_experts} experts, "
            f"top-{model.top_k}, but the trace ({tm.name}) has {tm.num_layers} x {tm.num_experts}, top-{tm.top_k}")


def run_loaded(
    loaded: LoadedScenario,
    *,
    timeline: bool = False,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
) -> RunResult:
    """Run a validated scenario. ``trace`` may be passed in to reuse an already loaded one."""
    scen = loaded.scenario
    source = loaded.source or "scenario"
    tr = trace if trace is not None else load_trace(loaded)
    model = loaded.model_spec(tr.model.name)
    hw = loaded.hardware_spec()
    check_shapes(tr, model, source)
    budget = scen.cache.budget_bytes(model)
    buffer = int(round(scen.cache.buffer_experts * model.expert_bytes))
    total = model.non_expert_bytes + budget + buffer
    if total > hw.vram_gib * GIB:
        raise ScenarioError(
            f"{source}: cache: non-expert weights ({model.non_expert_bytes / GIB:.2f} GiB) + expert budget "
            f"({budget / GIB:.2f} GiB) + buffer ({buffer / GIB:.2f} GiB) exceed the {hw.vram_gib:g} GiB of "
            f"{hw.name}; lower the budget or override hardware.vram_gib")
    pspec = scen.policy_spec
    policy = make_policy(pspec.name, pspec.params)
    wl = build_workload(tr, batch_size=scen.workload.batch_size, phases=scen.workload.phases,
                        requests=scen.workload.requests)
    engine = Engine(wl, policy, CostModel(model, hw), budget_bytes=budget, buffer_bytes=buffer,
                    initial=scen.cache.initial, swap_out=scen.cache.swap_out, seed=scen.seed, record_timeline=timeline, progress=progress)
    try:
        engine.run()
    except ValueError as exc:  # a policy or budget rule refused the run
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"{source}: policy {pspec.name!r}: {exc}") from None
    metrics = compute_metrics(engine)
    config = loaded.resolved()
    config["resolved"] = {
        "model": model.model_dump(mode="json"),
        "hardware": hw.model_dump(mode="json", exclude_none=True),
        "policy": {"name": policy.name, "params": policy.get_params(), "bound": policy.oracle},
        "expert_bytes": model.expert_bytes,
        "budget_bytes": budget,
        "buffer_bytes": buffer,
        "budget_experts_per_layer": budget / model.expert_bytes / model.num_layers,
        "config_hash": loaded.config_hash(),
    }
    metrics["scenario"] = scen.name
    metrics["config_hash"] = loaded.config_hash()
    return RunResult(config=config, metrics=metrics, engine=engine, model=model, hardware=hw)
