"""Run a scenario end to end: resolve the trace, model, hardware, runtime, budget and policy,
build the profile split and the workload, run the engine and compute the metrics. Used by
``simctl run``, sweeps, notebooks and tests alike.

A :class:`RunResult` is plain data (dicts, numpy arrays, lists, pydantic specs): it pickles,
so a sweep worker can send it back. User errors (bad scenario, a policy that cannot run on this
trace) are :class:`~moesim.sim.core.errors.MoesimError`; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.policies.contract.base import MissingColumnsError, Policy, PolicySetupError, Profile
from moesim.policies.contract.plugins import load_plugins, plugin_record
from moesim.policies.contract.registry import PolicyError, make_policy
from moesim.sim.config.catalog import GIB, HardwareSpec, ModelSpec, RuntimeSpec
from moesim.sim.config.scenario import LoadedScenario, ScenarioError, file_digest
from moesim.sim.config.serving_spec import SchedulerSpec
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.arrivals import poisson_arrivals, read_arrivals
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.records import TimelineEvent
from moesim.sim.engine.serving_workload import serving_workload
from moesim.sim.engine.transfers import BudgetError
from moesim.sim.engine.workload import Workload, build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.kv_budget import context_metrics, kv_budget, kv_not_modelled
from moesim.sim.run.metrics import compute_metrics
from moesim.sim.run.profile import profile_from_trace, trace_requests
from moesim.sim.run.run_warnings import run_warnings
from moesim.sim.run.serving_metrics import serving_metrics
from moesim.traces.format.trace_file import ModelInfo, Trace, read_trace, trace_from_columns


class PolicyNotApplicable(ScenarioError):
    """The scenario's policy needs a trace column that its trace lacks (a user error for one run;
    a sweep records the point as ``n/a``)."""


@dataclass
class RunResult:
    """Everything a run produced: the resolved config, the metrics, the per-step records (one
    numpy array per field), the timeline (when recorded) and the resolved specs."""

    config: dict[str, Any]
    metrics: dict[str, Any]
    steps: dict[str, np.ndarray]
    model: ModelSpec
    hardware: HardwareSpec
    timeline: list[TimelineEvent] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    """Overrides applied to the scenario file and catalog entries (``LoadedScenario.changes``)."""


def load_trace(loaded: LoadedScenario, columns: frozenset[str] | None = None) -> Trace:
    """The scenario's trace: a validated file (only ``columns`` of the optional ones, all when
    None), or generated from ``{synthetic: {...}}``."""
    path = loaded.trace_path()
    if path is not None:
        missing = loaded.missing_trace()
        if missing is not None:
            raise ScenarioError(missing)
        return read_trace(path, None if columns is None else sorted(columns))
    from moesim.traces.synthetic.generator import (  # generator only when asked for
        SynthParams,
        generate,
    )

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
    generated, meta = generate(params)
    return trace_from_columns(generated, meta)


def check_shapes(trace: Trace, model: ModelSpec, source: str) -> None:
    """The model spec must have the trace's shape."""
    tm = trace.model
    if (tm.num_layers, tm.num_experts, tm.top_k) != (model.num_layers, model.num_experts, model.top_k):
        raise ScenarioError(
            f"{source}: model {model.name!r} has {model.num_layers} MoE layers x {model.num_experts} experts, "
            f"top-{model.top_k}, but the trace ({tm.name}) has {tm.num_layers} x {tm.num_experts}, top-{tm.top_k}")


def split_profile(loaded: LoadedScenario, trace: Trace) -> tuple[Profile | None, list[int]]:
    """The profile split and the requests left for the workload (all of them without one)."""
    scen = loaded.scenario
    source = loaded.source or "scenario"
    present = trace_requests(trace)
    prof = scen.profile
    if prof is None:
        return None, present
    path = loaded.profile_path()
    if path is not None:
        ptrace = read_trace(path)
        tm, pm = trace.model, ptrace.model
        if (tm.num_layers, tm.num_experts, tm.top_k) != (pm.num_layers, pm.num_experts, pm.top_k):
            raise ScenarioError(f"{source}: profile.trace: {path} has {pm.num_layers} x {pm.num_experts}, "
                                f"top-{pm.top_k}; the trace has {tm.num_layers} x {tm.num_experts}, top-{tm.top_k}")
        preqs = trace_requests(ptrace)
        if prof.requests is not None:
            preqs = preqs[:prof.requests]
        return profile_from_trace(ptrace, preqs, f"{path} ({len(preqs)} requests)"), present
    assert prof.requests is not None
    if prof.requests >= len(present):
        raise ScenarioError(f"{source}: profile.requests: {prof.requests} of the trace's {len(present)} "
                            "requests leaves none to replay")
    preqs = present[:prof.requests]
    return (profile_from_trace(trace, preqs, f"the trace's first {prof.requests} requests"),
            present[prof.requests:])


@dataclass
class PreparedRun:
    """A scenario resolved into an engine ready to run. :meth:`run` runs it and returns the
    plain-data :class:`RunResult`; the engine (its ``state``: policy, workload and counters)
    stays here for scripts that read more than the metrics."""

    loaded: LoadedScenario
    engine: Engine
    model: ModelSpec
    hardware: HardwareSpec
    runtime: RuntimeSpec
    profile: Profile | None
    budget: int
    buffer: int

    @property
    def policy(self) -> Policy:
        """The policy object of the run."""
        return self.engine.state.policy

    def run(self) -> RunResult:
        """Run the engine; a policy or budget that cannot work here is one line naming it."""
        source = self.loaded.source or "scenario"
        engine, model = self.engine, self.model
        state = engine.state
        policy = state.policy
        try:
            engine.run()
        except MissingColumnsError as exc:
            raise PolicyNotApplicable(f"{source}: policy {policy.name!r}: {exc}") from None
        except PolicySetupError as exc:
            raise ScenarioError(f"{source}: policy {policy.name!r}: {exc}") from None
        except BudgetError as exc:
            raise ScenarioError(f"{source}: cache.{self.loaded.scenario.cache.given}: {exc}") from None
        state.warnings.extend(w for w in run_warnings(self.loaded, state, model, self.budget)
                              if w not in state.warnings)
        metrics = compute_metrics(state)
        config = self.loaded.resolved()
        config_hash = self.loaded.config_hash()
        config["resolved"] = {
            "model": model.model_dump(mode="json"),
            "hardware": self.hardware.model_dump(mode="json", exclude_none=True),
            "runtime": self.runtime.model_dump(mode="json", exclude_none=True),   # host_memory only when set
            "policy": {"name": policy.name, "params": policy.get_params(), "bound": policy.oracle},
            "expert_bytes": model.expert_bytes,
            "budget_bytes": self.budget,
            "buffer_bytes": self.buffer,
            "budget_experts_per_layer": self.budget / model.expert_bytes / model.num_layers,
            "profile": None if self.profile is None else self.profile.source,
            "trace": describe_trace(self.loaded, self.engine.state.trace),
            "config_hash": config_hash,
        }
        wl = self.engine.state.workload
        if wl.kv_modelled:   # the KV cache is modelled: its size and what it left to experts
            metrics.update(context_metrics(model, wl, self.budget))
            if not self.runtime.kv_on_host:   # runtime.kv_on_host: the KV cache is in host memory
                metrics["vram_peak_gib"] += metrics["kv_gib"]
        elif wl.serving is not None:   # serving without an attention shape: say so, never leave it out silently
            metrics["kv_cache"] = kv_not_modelled(model)
        if state.scheduler is not None:   # serving: latency percentiles, throughput, goodput
            metrics["serving"] = serving_metrics(state.scheduler, metrics["sim_time_s"], self.loaded.scenario.slo)
        metrics["scenario"] = self.loaded.scenario.name
        metrics.update(join_keys(self.loaded, model, self.hardware, self.runtime, self.budget, self.engine.state.trace))
        metrics["config_hash"] = config_hash
        plugins = self.loaded.plugin_paths()
        if plugins:   # code of the user's that ran in this process: which files, which bytes
            metrics["plugins"] = plugin_record(plugins)
        fits = self.loaded.fit_provenance()
        if fits:   # fitted values in this run: where they come from and how well they predict
            metrics["fit"] = fits
        steps = state.steps.columns() if state.record_steps else {}
        return RunResult(config=config, metrics=metrics, steps=steps, model=model,
                         hardware=self.hardware, timeline=state.timeline, changes=self.loaded.changes())


def scenario_policy(loaded: LoadedScenario) -> Policy:
    """The scenario's policy, built as every run builds it: its plugins loaded, its parameters
    checked (a bad one is one line naming the scenario) and the scenario's ``cache.scope`` (the
    pool layout) put in place of the policy's own."""
    scen = loaded.scenario
    try:
        load_plugins(loaded.plugin_paths(), loaded.source or "scenario")
    except PolicyError as exc:
        msg = str(exc)
        raise ScenarioError(msg if msg.startswith(loaded.source or "scenario") else
                            f"{loaded.source or 'scenario'}: {msg}") from None
    pspec = scen.policy_spec
    try:
        policy = make_policy(pspec.name, pspec.params)
    except PolicyError as exc:
        raise ScenarioError(f"{loaded.source or 'scenario'}: {exc}") from None
    if scen.cache.scope is not None:
        policy.scope = scen.cache.scope
    return policy


def prepare_run(
    loaded: LoadedScenario,
    *,
    timeline: bool = False,
    steps: bool = True,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
    check_invariants: bool = False,
    workload: Workload | None = None,
) -> PreparedRun:
    """Resolve a validated scenario into an engine (``trace`` may be passed in to reuse an
    already loaded one, and with it ``workload``, the one another run of the same trace and
    workload keys built: runs do not change it)."""
    scen = loaded.scenario
    source = loaded.source or "scenario"
    policy = scenario_policy(loaded)
    if trace is None:
        cols = policy.read_columns() | policy.required_columns() | ({"weights"} if policy.lossy else set())
        trace = load_trace(loaded, frozenset(cols))
    tr = trace
    shape = trace_shape(tr.model)
    model = loaded.model_spec(tr.model.name, shape)
    hw = loaded.hardware_spec()
    runtime = loaded.runtime_spec()
    check_shapes(tr, model, source)
    epl = scen.cache.experts_per_layer
    if epl is not None and epl > model.num_experts:
        raise ScenarioError(f"{source}: cache.experts_per_layer: {epl:g} is more than the {model.num_experts} "
                            f"experts of a layer of {model.name}")
    budget = scen.cache.budget_bytes(model)
    buffer = int(round(scen.cache.buffer_experts * model.expert_bytes))
    context = scen.workload.context_tokens
    if context and model.kv_bytes_per_token is None:
        raise ScenarioError(f"{source}: workload.context_tokens: model {model.name} gives no attention shape "
                            "(attention_heads with kv_heads and head_dim, or kv_lora_rank): its KV cache cannot be modelled")
    if runtime.eager_score_bytes is not None and (model.attention_heads is None or model.attention_flops_per_pair is None):
        raise ScenarioError(f"{source}: runtime.eager_score_bytes: model {model.name} gives no attention shape "
                            "(attention_heads with head_dim, or kv_lora_rank): its eager attention cannot be modelled")
    if runtime.kv_on_host and hw.device == "cpu":
        raise ScenarioError(f"{source}: runtime.kv_on_host: hardware {hw.name} runs the model on the CPU (device: cpu), "
                            "so there is no GPU to keep the KV cache from; leave kv_on_host off")
    serving = scen.workload.arrivals is not None
    # a serving run holds its requests' KV cache whenever the model gives an attention shape
    kv_on = bool(context) or (serving and model.kv_bytes_per_token is not None)
    kv_in_vram = kv_on and not runtime.kv_on_host   # runtime.kv_on_host: the KV cache is in host memory
    total = model.non_expert_bytes + budget + buffer
    if total > hw.vram_gib * GIB and not kv_in_vram:
        raise ScenarioError(
            f"{source}: cache.{scen.cache.given}: non-expert weights ({model.non_expert_bytes / GIB:.2f} GiB) + expert budget "
            f"({budget / GIB:.2f} GiB) + buffer ({buffer / GIB:.2f} GiB) exceed the {hw.vram_gib:g} GiB of "
            f"{hw.name}; lower the budget or override hardware.vram_gib")
    profile, requests = select_requests(loaded, tr)
    if serving and policy.oracle:
        raise ScenarioError(f"{source}: policy {policy.name!r} is an oracle bound: it reads the whole workload ahead, "
                            "and with workload.arrivals the iterations depend on when the GPU frees")
    if (workload is not None and workload.trace is tr and workload.context_tokens == context
            and (workload.serving is not None) == serving and workload.kv_modelled == kv_on):
        wl = workload
    else:
        try:
            wl = build_workload(tr, batch_size=scen.workload.batch_size, phases=scen.workload.phases,
                                requests=requests, context_tokens=0 if serving else context)
            if serving:
                wl = build_serving(loaded, tr, wl.requests, kv_modelled=kv_on)
        except MoesimError as exc:
            raise ScenarioError(f"{source}: {exc}") from None
    asked = budget
    if kv_in_vram:
        budget = kv_budget(source, scen.cache.given, model, hw, wl, budget, buffer)
    engine = Engine(wl, policy, CostModel(model, hw, runtime), budget_bytes=budget, buffer_bytes=buffer,
                    initial=scen.cache.initial, swap_out=scen.cache.swap_out,
                    serial_swap=bool(scen.cache.serial_swap),
                    pcie_order=scen.pcie.order, sync_prefetch=scen.pcie.sync_prefetch, seed=scen.seed,
                    profile=profile, record_steps=steps, record_timeline=timeline,
                    check_invariants=check_invariants, progress=progress, fast_replay=FAST_PATH)
    if steps:   # one record per (iteration, layer): held at their final size from the start
        engine.state.steps.reserve(len(wl.iterations) * tr.model.num_layers)
    if budget < asked:
        engine.state.warnings.append(
            f"cache.{scen.cache.given}: cut from {asked // model.expert_bytes} to {budget // model.expert_bytes} experts: "
            "the KV cache at its peak takes the rest of VRAM")
    note = loaded.model_note(tr.model.name, shape)
    if note:
        engine.state.warnings.append(note)
    return PreparedRun(loaded=loaded, engine=engine, model=model, hardware=hw, runtime=runtime,
                       profile=profile, budget=budget, buffer=buffer)


def build_serving(loaded: LoadedScenario, trace: Trace, chosen: list[int], *, kv_modelled: bool) -> Workload:
    """The serving workload of ``loaded`` (``workload.arrivals``) over the trace requests ``chosen``
    (``kv_modelled``: the model gives an attention shape, so the requests' KV cache is read and held)."""
    spec = loaded.scenario.workload
    arr = spec.arrivals
    assert arr is not None
    if arr.rate is not None:
        arrivals = poisson_arrivals(arr.rate, arr.requests or len(chosen), loaded.scenario.seed)
    else:
        path = loaded.arrivals_path()
        assert path is not None
        arrivals = read_arrivals(path)
    sched = spec.scheduler or SchedulerSpec.model_validate({})
    return serving_workload(trace, chosen, spec.phases, arrivals, kind=sched.kind, max_batch=sched.max_batch,
                            max_tokens=sched.max_tokens, context_tokens=spec.context_tokens, kv_modelled=kv_modelled)


def describe_trace(loaded: LoadedScenario, trace: Trace) -> str:
    """The trace in a few words, for the summary: its file (or how it was synthesised) and the
    routing shape it records."""
    m = trace.model
    shape = f"{m.name}, {m.num_layers} MoE layers x {m.num_experts} experts, top-{m.top_k}"
    path = loaded.trace_path()
    if path is not None:
        return f"{path.name} ({shape})"
    if loaded.trace_fit is not None:
        return f"synthesised from the fit {Path(loaded.trace_fit).name} ({shape})"
    spec = loaded.scenario.trace
    preset = spec["synthetic"].get("preset") if isinstance(spec, dict) else None
    return f"synthetic{f', preset {preset}' if preset else ''} ({shape})"


JOIN_KEYS = ("model_name", "hardware_name", "runtime_name", "runtime_source", "cache_rate", "trace_name",
             "trace_sha256")
"""The scenario keys every run's metrics carry (besides ``policy`` and ``config_hash``), so
that ``metrics.json`` files and sweep rows join on them: the model, hardware and runtime names,
where the runtime's numbers come from, the expert budget as a fraction of the routed experts'
bytes, and the trace's file name and sha256 (of a synthetic trace: of its parameters)."""


def join_keys(loaded: LoadedScenario, model: ModelSpec, hardware: HardwareSpec, runtime: RuntimeSpec, budget: int,
              trace: Trace) -> dict[str, Any]:
    """The :data:`JOIN_KEYS` of a run."""
    path = loaded.trace_path()
    if path is not None:
        name, digest = path.name, file_digest(path)
    else:
        spec = loaded.scenario.trace if loaded.trace_fit is None else {"fit": loaded.trace_fit}
        name = describe_trace(loaded, trace)
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()
    routed = model.expert_bytes * model.num_layers * model.num_experts
    return {"model_name": model.name, "hardware_name": hardware.name, "runtime_name": runtime.name,
            "runtime_source": runtime.source, "cache_rate": budget / routed if routed else None,
            "trace_name": name, "trace_sha256": digest}


def trace_shape(model: ModelInfo) -> dict[str, int]:
    """The routing shape a trace records (its metadata's ``model``), as the fields of a model
    spec: a model outside the catalog takes it
    (:meth:`~moesim.sim.config.scenario.LoadedScenario.model_spec`)."""
    return {"num_layers": model.num_layers, "num_experts": model.num_experts, "top_k": model.top_k,
            "num_shared_experts": model.num_shared_experts}


def select_requests(loaded: LoadedScenario, trace: Trace) -> tuple[Profile | None, Any]:
    """The profile split and the requests the workload replays: ``workload.requests``, taken
    from what the split leaves when the profile comes from the trace itself (a request of the
    split asked for by id, or more requests than remain, is one line naming the key). The
    simulator's run and the executor's (``simctl validate``) select them here alike."""
    scen = loaded.scenario
    source = loaded.source or "scenario"
    profile, remaining = split_profile(loaded, trace)
    req_spec = scen.workload.requests
    if scen.profile is None or scen.profile.trace is not None:
        return profile, req_spec
    if isinstance(req_spec, list):
        overlap = sorted(set(req_spec) - set(remaining))
        if overlap:
            raise ScenarioError(f"{source}: workload.requests: request {overlap[0]} belongs to the profile split")
        return profile, req_spec
    if req_spec != "all" and req_spec > len(remaining):
        raise ScenarioError(f"{source}: workload.requests: {req_spec} requests asked for, "
                            f"{len(remaining)} remain after the profile split")
    return profile, remaining if req_spec == "all" else remaining[:req_spec]


def run_loaded(
    loaded: LoadedScenario,
    *,
    timeline: bool = False,
    steps: bool = True,
    progress: Callable[[int, int], None] | None = None,
    trace: Trace | None = None,
    check_invariants: bool = False,
) -> RunResult:
    """Run a validated scenario (see :func:`prepare_run`)."""
    return prepare_run(loaded, timeline=timeline, steps=steps, progress=progress, trace=trace,
                       check_invariants=check_invariants).run()
