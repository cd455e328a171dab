"""Hit-rate curves of any policy: the simulator run once per cache size.

LRU and Belady have exact one-pass curves (stack distances, :mod:`moesim.traces.analysis.curve`).
Every other policy's cache is not a stack algorithm in general (FIFO's is not; LFU's depends on
ties), so its curve is measured the plain way: the trace replayed once per size, batch 1, in
trace order, starting from an empty cache, on the simulator itself (:func:`simulated_curve`).
The demand-only policies with exact kernels (lru, fifo, lfu, random, static, belady...) take
the fast path (milliseconds per size on the bundled sample); policies that prefetch run the
event loop, where hit rates also depend on timing, so the hardware is a parameter (default an
RTX 4090, its memory lifted so that every size fits). Per-layer hits come from the run's
per-step records; "all layers" (layer ``-1``) sums them, as the stack curves do.

Every row also says the size as a share of a layer's experts (``cache_pct``) and in GiB of
expert weights over all layers (``cache_gib``), from the model the trace records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from moesim.sim.config.scenario import LoadedScenario

STACK = ("lru", "belady")
"""The policies with exact one-pass curves."""
ROOMY_VRAM_GIB = 1e5
"""The device memory the simulated curve's hardware is given, so that any size fits."""


class PolicyCurveError(MoesimError, ValueError):
    """A policy whose curve cannot be measured here (unknown, or it cannot run on this trace)."""


def curve_scenario(trace: Path, policy: str, size: int, phases: Sequence[str], hardware: str) -> LoadedScenario:
    """The scenario of one point of a simulated curve: ``size`` experts per layer, empty at
    the start, batch 1, every request of ``phases``."""
    from moesim.sim.config.scenario import ScenarioError, load_scenario_data

    data: dict[str, Any] = {
        "name": f"curve-{policy}-{size}", "trace": str(trace.resolve()),
        "hardware": {"base": hardware, "vram_gib": ROOMY_VRAM_GIB},
        "cache": {"experts_per_layer": size, "initial": "empty"}, "policy": policy,
        "workload": {"batch_size": 1, "phases": list(phases), "requests": "all"}, "seed": 0}
    try:
        return load_scenario_data(data, source=f"curve {policy} at {size} experts", base_dir=trace.resolve().parent)
    except ScenarioError as exc:
        raise PolicyCurveError(str(exc)) from None


def simulated_curve(trace: Path, policy: str, sizes: Sequence[int], phases: Sequence[str],
                    hardware: str = "rtx-4090") -> tuple[dict[str, list[Any]], list[str]]:
    """Hits and references of ``policy`` per layer and all layers at each of ``sizes``
    (experts per layer), one simulator run per size (see the module docstring). The runs are
    a sweep's points, so a policy runs with its paper's setup defaults where the trace allows
    (returned: what was applied) and one that cannot run as its paper meant it here is one
    line saying why (:mod:`moesim.sim.study.needs`)."""
    import numpy as np

    from moesim.sim.config.scenario import ScenarioError, load_scenario_data
    from moesim.sim.run.runner import PolicyNotApplicable, load_trace, run_loaded
    from moesim.sim.study.sweep import SweepError, SweepSpec, expand

    base = curve_scenario(trace, policy, sizes[0], phases, hardware).scenario.model_dump(mode="json", exclude_none=True)
    base["trace"] = str(trace.resolve())
    spec = SweepSpec(name=f"curve-{policy}", base=base, grid={"cache.experts_per_layer": list(sizes)})
    try:
        sweep = expand(spec, source=f"curve {policy}", base_dir=trace.resolve().parent)
    except SweepError as exc:
        raise PolicyCurveError(f"--policy {policy}: {exc}") from None
    unmet = next((p.unmet for p in sweep.points if p.unmet), None)
    if unmet:
        raise PolicyCurveError(f"--policy {policy}: n/a on this trace: {unmet}")
    cols: dict[str, list[Any]] = {"policy": [], "layer": [], "size": [], "hits": [], "references": []}
    loaded_trace = None
    for size, point in zip(sizes, sweep.points, strict=True):
        try:
            loaded = load_scenario_data(point.data, source=point.source, base_dir=point.base_dir)
            if loaded_trace is None:
                loaded_trace = load_trace(loaded)
            result = run_loaded(loaded, trace=loaded_trace)
        except (PolicyNotApplicable, ScenarioError) as exc:
            raise PolicyCurveError(f"--policy {policy}: {exc}") from None
        steps = result.steps
        layer = np.asarray(steps["layer"])
        hits = np.asarray(steps["hits"])
        refs = hits + np.asarray(steps["late"]) + np.asarray(steps["partial"]) + np.asarray(steps["misses"])
        n_layers = result.model.num_layers
        per_hits = np.bincount(layer, weights=hits, minlength=n_layers).astype(np.int64)
        per_refs = np.bincount(layer, weights=refs, minlength=n_layers).astype(np.int64)
        for lay in [*range(n_layers), -1]:
            cols["policy"].append(policy)
            cols["layer"].append(lay)
            cols["size"].append(size)
            cols["hits"].append(int(per_hits.sum() if lay < 0 else per_hits[lay]))
            cols["references"].append(int(per_refs.sum() if lay < 0 else per_refs[lay]))
    applied = list(dict.fromkeys(a for p in sweep.points for a in p.applied))
    return cols, applied


def size_columns(sizes: np.ndarray, trace: Path) -> dict[str, np.ndarray]:
    """``cache_pct`` (share of a layer's experts) and ``cache_gib`` (expert weights over all
    layers) of each size in experts per layer, from the model the trace records."""
    import numpy as np

    from moesim.sim.config.catalog import GIB
    from moesim.sim.run.runner import trace_shape
    from moesim.traces.format.trace_file import read_meta

    meta = read_meta(trace)
    loaded = curve_scenario(trace, "lru", 1, ["decode"], "rtx-4090")
    model = loaded.model_spec(meta.model.name, trace_shape(meta.model))
    s = np.asarray(sizes, dtype=np.float64)
    return {"cache_pct": 100.0 * s / model.num_experts,
            "cache_gib": s * model.num_layers * model.expert_bytes / GIB}
