"""Hit-rate curves of any policy: the simulator run once per cache size, every policy on the
same references.

The hit rate is the simulator's (docs/contract.md, "Hit rate"): a layer's routed experts of a
token are looked up together, so a token never evicts one of its own experts. Every policy,
LRU and Belady included, is measured the plain way: the trace replayed once per size, batch 1,
in trace order, from an empty cache, on the simulator itself (:func:`simulated_curves`), so
that a curve's point is the ``hit_rate`` of ``simctl run`` on that scenario. The demand-only
policies with exact kernels (lru, fifo, lfu, random, static, belady...) take the fast path;
policies that prefetch run the event loop, where hit rates also depend on timing, so the
hardware is a parameter (default an RTX 4090, its memory lifted so that every size fits).

The points are one study (:mod:`moesim.sim.study.sweep`): the policies at one size are a
comparison group, so a profile split one of them needs (fMoE's expert maps, MoE-Infinity's
activation matrix...) is split off the front of the trace for *every* policy, and all replay
the same requests; a policy that cannot run on the trace is ``n/a`` with its reason
(:mod:`moesim.sim.study.needs`), one row per size, never an abort.

:func:`one_pass_curves` gives LRU's and Belady's reference-by-reference curves (stack
distances, :mod:`moesim.traces.analysis.curve`) over the same requests: another definition (each
expert looked up alone, so a token's later experts may push out its earlier ones), labelled
``one-pass`` wherever it appears.

Per-layer hits come from the run's per-step records; "all layers" (layer ``-1``) sums them.
Every row also says the size as a share of a layer's experts (``cache_pct``) and in GiB of
expert weights over all layers (``cache_gib``), from the model the trace records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from moesim.sim.config.scenario import LoadedScenario
    from moesim.sim.study.sweep import Sweep

STACK = ("lru", "belady")
"""The policies with exact one-pass (reference-by-reference) curves."""
ROOMY_VRAM_GIB = 1e5
"""The device memory the simulated curve's hardware is given, so that any size fits."""
COLUMNS = ("policy", "layer", "size", "hits", "references", "method", "note")
"""The columns of a curve table before the size columns: ``method`` is ``simulated``,
``one-pass`` or ``n/a``; ``note`` the reason of an ``n/a`` row (empty otherwise)."""


class PolicyCurveError(MoesimError, ValueError):
    """A curve that cannot be measured at all (its scenario or study does not validate)."""


@dataclass
class CurveRows:
    """Rows of a curve table as column lists (:data:`COLUMNS`), the setup notes applied to
    every policy, and the requests every policy replayed."""

    cols: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in COLUMNS})
    applied: list[str] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)

    def add(self, policy: str, layer: int, size: int, hits: int, refs: int, method: str, note: str = "") -> None:
        """Append one row."""
        for k, v in zip(COLUMNS, (policy, layer, size, hits, refs, method, note), strict=True):
            self.cols[k].append(v)


def curve_scenario(trace: Path, policy: str, size: int, phases: Sequence[str], hardware: str) -> LoadedScenario:
    """The scenario of one point of a simulated curve: ``size`` experts per layer, empty at
    the start, batch 1, every request of ``phases``."""
    from moesim.sim.config.scenario import ScenarioError, load_scenario_data

    try:
        return load_scenario_data(curve_data(trace, policy, size, phases, hardware),
                                  source=f"curve {policy} at {size} experts", base_dir=trace.resolve().parent)
    except ScenarioError as exc:
        raise PolicyCurveError(str(exc)) from None


def curve_data(trace: Path, policy: str, size: int, phases: Sequence[str], hardware: str) -> dict[str, Any]:
    """The scenario mapping of :func:`curve_scenario`."""
    return {"name": f"curve-{policy}-{size}", "trace": str(trace.resolve()),
            "hardware": {"base": hardware, "vram_gib": ROOMY_VRAM_GIB},
            "cache": {"experts_per_layer": size, "initial": "empty"}, "policy": policy,
            "workload": {"batch_size": 1, "phases": list(phases), "requests": "all"}, "seed": 0}


def curve_study(trace: Path, policies: Sequence[str], sizes: Sequence[int], phases: Sequence[str],
                hardware: str = "rtx-4090") -> Sweep:
    """The study of a curve: every policy at every size, each size a comparison group (so
    that a profile split or a transfer buffer one policy needs is given to all of them)."""
    from moesim.sim.study.sweep import SweepError, SweepSpec, expand

    spec = SweepSpec(name="curve", base=curve_data(trace, policies[0], sizes[0], phases, hardware),
                     grid={"policy": list(policies), "cache.experts_per_layer": list(sizes)})
    try:
        return expand(spec, source="curve", base_dir=trace.resolve().parent)
    except SweepError as exc:
        raise PolicyCurveError(str(exc)) from None


def _per_layer(result: Any) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    steps = result.steps
    layer = np.asarray(steps["layer"])
    hits = np.asarray(steps["hits"])
    refs = hits + np.asarray(steps["late"]) + np.asarray(steps["partial"]) + np.asarray(steps["misses"])
    n = result.model.num_layers
    return (np.bincount(layer, weights=hits, minlength=n).astype(np.int64),
            np.bincount(layer, weights=refs, minlength=n).astype(np.int64))


def simulated_curves(sweep: Sweep, num_layers: int) -> CurveRows:
    """Hits and references per layer and all layers of every point of a curve study, one
    simulator run each; a point that cannot run is one ``n/a`` row (all layers) with why."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.profile import trace_requests
    from moesim.sim.run.runner import PolicyNotApplicable, load_trace, run_loaded, select_requests

    rows = CurveRows()
    traces: dict[str, Any] = {}
    for point in sweep.points:
        size = int(point.params["cache.experts_per_layer"])
        if point.unmet:
            rows.add(point.policy, -1, size, 0, 0, "n/a", point.unmet)
            continue
        try:
            loaded = load_scenario_data(point.data, source=point.source, base_dir=point.base_dir)
            if point.policy not in traces:
                traces[point.policy] = load_trace(loaded)
                if not rows.requests:
                    chosen = select_requests(loaded, traces[point.policy])[1]
                    rows.requests = [int(r) for r in (trace_requests(traces[point.policy]) if chosen == "all"
                                                      else chosen)]
            result = run_loaded(loaded, trace=traces[point.policy])
        except (PolicyNotApplicable, MoesimError) as exc:   # one line saying why: the others still run
            rows.add(point.policy, -1, size, 0, 0, "n/a", str(exc))
            continue
        hits, refs = _per_layer(result)
        for lay in range(num_layers):
            rows.add(point.policy, lay, size, int(hits[lay]), int(refs[lay]), "simulated")
        rows.add(point.policy, -1, size, int(hits.sum()), int(refs.sum()), "simulated")
    rows.applied = list(dict.fromkeys(a for p in sweep.points for a in p.applied))
    return rows


def one_pass_curves(trace: Path, policies: Sequence[str], sizes: Sequence[int], phases: Sequence[str],
                    requests: Sequence[int] | None) -> CurveRows:
    """LRU's and Belady's reference-by-reference curves (stack distances) over ``requests``
    (None: every request) of ``phases``, batch 1, trace order, at ``sizes``."""
    import numpy as np

    from moesim.sim.engine.workload import build_workload
    from moesim.traces.analysis.curve import curves
    from moesim.traces.format.trace_file import read_trace

    tr = read_trace(trace, [])
    wl = build_workload(tr, batch_size=1, phases=phases, requests=list(requests) if requests else "all")
    rows0 = wl.token_rows()
    m = tr.model
    streams = (tr.experts[rows0 + layer].reshape(-1) for layer in range(m.num_layers))
    cols = curves((s[s >= 0] for s in streams), m.num_experts).columns()
    keep = np.isin(cols["policy"], list(policies)) & np.isin(cols["size"], list(sizes))
    rows = CurveRows()
    for p, lay, s, h, r in zip(*(cols[k][keep].tolist() for k in ("policy", "layer", "size", "hits", "references")),
                               strict=True):
        rows.add(str(p), int(lay), int(s), int(h), int(r), "one-pass")
    return rows


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
