"""``simctl advise``: which offloading system and which settings for a given model, GPU and
memory, by simulating every setting that fits.

The options (:mod:`moesim.sim.study.advise_options`) become the points of one sweep (a zipped
axis of policy, expert budget, runtime and model), run by the sweep machinery
(:func:`moesim.sim.study.sweep_run.run_sweep`: a point file per option, so a run given the same
``--out`` again reuses every finished point; a process pool or Dask; a progress bar). The
result is one row per option (system, setting, VRAM used, host memory used, tokens/s), the best
option per weight width, the Pareto front of VRAM against speed, and the calibration the
predictions rest on: the hardware's and each runtime's sources, and the held-out error of a
``simctl fit`` file where one is given.

The default workload is short, so that the whole search takes seconds: the model's synthetic
preset (or default knobs), 3 requests of 16 prompt and 64 generated tokens; the first request
is the offline profile (Fiddler's popularity), the other two are decoded at batch 1.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.sim.core.errors import MoesimError
from moesim.sim.study.advise_options import (
    SYSTEMS,
    Memory,
    Option,
    Shape,
    all_options,
    least_needed,
)

REQUESTS, PROMPT, DECODE = 3, 16, 64
# Widths tried, in order, when the user gives no --bits and the model's own does not fit:
# llama.cpp's Q8_0 (blocks of 32 int8 weights and one fp16 scale: 34 bytes per 32 weights =
# 8.5 bits) and Q4_K (super-blocks of 256 weights in 144 bytes = 4.5 bits), ggml's block formats.
FALLBACK_BITS = {8.5: "Q8_0", 4.5: "Q4_K"}


class AdviseError(MoesimError, ValueError):
    """Input ``simctl advise`` cannot use, or nothing fits; the message is one line."""


@dataclass
class AdviseRequest:
    """What the user gives: the model, the GPU (catalog name or hardware file), the memory and
    optionally a trace, weight widths, a host CPU, runtime and calibration files."""

    model: str
    gpu: str
    vram_gib: float
    host_gib: float
    trace: str | None = None
    bits: list[float] | None = None
    cpu: str | None = None
    runtime: str | None = None
    calibration: str | None = None
    reserve_gib: float = 1.5
    host_reserve_gib: float = 4.0
    systems: list[str] | None = None
    decode_tokens: int = DECODE


@dataclass
class Row:
    """One simulated option."""

    option: Option
    tokens_per_s: float | None
    status: str
    error: str | None = None
    pareto: bool = False
    best: bool = False


@dataclass
class Advice:
    """The outcome: rows in option order, calibration lines, the workload said in words."""

    rows: list[Row]
    calibration: list[str]
    workload: str
    notes: list[str] = field(default_factory=list)
    points_run: int = 0
    points_reused: int = 0

    def ok(self) -> list[Row]:
        """Rows that ran."""
        return [r for r in self.rows if r.tokens_per_s is not None]

    def best(self) -> list[Row]:
        """The best row of each weight width."""
        return [r for r in self.ok() if r.best]


# --- inputs ---------------------------------------------------------------------------------------
def _hardware(req: AdviseRequest) -> dict[str, Any]:
    from moesim.sim.config.catalog import CatalogError, hardware_names, is_spec_file, load_spec_file
    from moesim.sim.config.catalog.host import host_names

    if is_spec_file(req.gpu):
        try:
            hw = load_spec_file(Path(req.gpu).resolve(), "hardware")
        except CatalogError as exc:
            raise AdviseError(f"--gpu: {exc}") from None
        hw.pop("provenance", None)
    elif req.gpu in hardware_names():
        hw = {"base": req.gpu}
    else:
        import difflib

        close = difflib.get_close_matches(req.gpu, hardware_names(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(hardware_names())}"
        raise AdviseError(f"--gpu {req.gpu}: not in the hardware catalog and not a .yaml file; {hint}")
    if req.cpu is not None:
        if req.cpu not in host_names():
            raise AdviseError(f"--cpu {req.cpu}: not in the host catalog; known: {', '.join(host_names())}")
        hw["cpu"] = req.cpu
    hw["vram_gib"] = req.vram_gib
    return hw


def _shape(req: AdviseRequest, bits: float | None) -> tuple[Shape, dict[str, Any]]:
    """The model at ``bits`` per weight (None: its own width) and its scenario reference."""
    from moesim.sim.config.catalog import get_model, model_names

    if req.model not in model_names():
        import difflib

        close = difflib.get_close_matches(req.model, model_names(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(model_names())}"
        raise AdviseError(f"--model {req.model}: not in the model catalog; {hint}")
    m = get_model(req.model)
    native = m.dtype_bytes * 8
    ref: dict[str, Any] = {"base": req.model}
    if bits is not None and not math.isclose(bits, native):
        ref.update(dtype_bytes=bits / 8, non_expert_bytes=int(m.non_expert_bytes * bits / native))
        m = get_model(ref)
    shape = Shape(req.model, m.num_layers, m.num_experts, int(m.expert_bytes), int(m.non_expert_bytes),
                  bits if bits is not None else native)
    return shape, ref


def _trace(req: AdviseRequest) -> tuple[str | dict[str, Any], str]:
    """The scenario's trace and the workload in words."""
    from moesim.traces.synthetic.generator import PRESETS

    n = req.decode_tokens
    if req.trace is not None:
        path = Path(req.trace)
        if not path.is_file():
            raise AdviseError(f"--trace {req.trace}: no such file")
        return str(path.resolve()), (f"{path.name}: its first request is the offline profile, the next two are "
                                     f"decoded at batch 1 (decode only)")
    synth: dict[str, Any] = {"requests": REQUESTS, "prompt_len": PROMPT, "decode_len": n, "seed": 0}
    if req.model in PRESETS:
        synth["preset"] = req.model
        what = f"the synthetic {req.model} preset"
    else:
        synth["model"] = req.model
        what = f"a synthetic trace of {req.model} (default router knobs: no preset for this model)"
    return {"synthetic": synth}, (f"{what}: {REQUESTS} requests of {PROMPT} prompt and {n} generated tokens; the "
                                  f"first is the offline profile (Fiddler's popularity), the other {REQUESTS - 1} "
                                  f"are decoded one at a time (batch 1, decode only, {(REQUESTS - 1) * n} tokens)")


def _calibration_key_known() -> bool:
    from moesim.sim.config.scenario import Scenario

    return "calibration" in Scenario.model_fields


def build(req: AdviseRequest) -> tuple[dict[str, Any], list[Option], str, list[str]]:
    """The base scenario, every option that fits, the workload in words and notes on what was
    assumed. Without ``bits`` the model's own width is tried, then :data:`FALLBACK_BITS` in
    order until something fits. Bad input, or no option that fits, raises :class:`AdviseError`."""
    for name, value in (("--vram", req.vram_gib), ("--host-mem", req.host_gib)):
        if not (value > 0 and math.isfinite(value)):
            raise AdviseError(f"{name} {value:g}: must be a positive number of GiB")
    unknown = [s for s in req.systems or [] if s not in SYSTEMS]
    if unknown:
        raise AdviseError(f"--systems {','.join(unknown)}: unknown; known: {', '.join(SYSTEMS)}")
    if req.runtime is not None and not Path(req.runtime).is_file():
        raise AdviseError(f"--runtime {req.runtime}: no such file")
    if req.calibration is not None:
        if not Path(req.calibration).is_file():
            raise AdviseError(f"--calibration {req.calibration}: no such file")
        if not _calibration_key_known():
            raise AdviseError("--calibration: this moesim has no `calibration:` scenario key (simctl fit); give the "
                              "fitted file as --gpu (its hardware section) or --runtime instead")
    hw = _hardware(req)
    trace, workload = _trace(req)
    mem = Memory(req.vram_gib, req.host_gib, req.reserve_gib, req.host_reserve_gib)
    notes: list[str] = []
    options: list[Option] = []
    shortfall = []
    widths: list[float | None] = list(req.bits) if req.bits else [None, *FALLBACK_BITS]
    for bits in widths:
        if bits is not None and not (0 < bits <= 32):
            raise AdviseError(f"--bits {bits:g}: expected bits per weight in (0, 32]")
        shape, ref = _shape(req, bits)
        found = all_options(shape, mem, req.systems)
        for o in found:
            o.model = ref
        options += found
        if not found:
            shortfall.append(least_needed(shape, mem))
        if req.bits is None and found:
            if bits is not None:   # the model's own width did not fit: say so
                notes.append(f"at the model's own width nothing fits ({shortfall[0]}); shown at {bits:g} bits per "
                             f"weight, the size of llama.cpp's {FALLBACK_BITS[bits]} (give --bits to choose)")
            break
    if not options:
        raise AdviseError(f"nothing fits {req.vram_gib:g} GiB of VRAM and {req.host_gib:g} GiB of host memory: "
                          + "; ".join(shortfall))
    base: dict[str, Any] = {
        "name": f"advise-{req.model}", "trace": trace, "hardware": hw, "model": req.model,
        "cache": {"experts_per_layer": 1}, "policy": "lru", "runtime": "none",
        "profile": {"requests": 1}, "workload": {"batch_size": 1, "phases": ["decode"]}, "seed": 0}
    if req.calibration is not None:
        base["calibration"] = str(Path(req.calibration).resolve())
    return base, options, workload, notes


def to_sweep(req: AdviseRequest, base: dict[str, Any], options: list[Option]) -> Any:
    """The options as the points of one sweep (one zipped axis, in option order)."""
    from moesim.sim.study.sweep import SweepError, SweepSpec, expand

    runtime = str(Path(req.runtime).resolve()) if req.runtime else None
    spec = SweepSpec(name=f"advise-{req.model}", base=copy.deepcopy(base), zip={
        "policy": [{"name": o.policy, "params": o.params} for o in options],
        "cache.experts_per_layer": [o.experts_per_layer for o in options],
        "runtime": [runtime or o.runtime for o in options],
        "model": [o.model for o in options],
    })
    try:
        return expand(spec, source="simctl advise", base_dir=Path.cwd())
    except SweepError as exc:
        raise AdviseError(str(exc)) from None


# --- results --------------------------------------------------------------------------------------
def pareto(rows: list[Row]) -> list[Row]:
    """The rows no other row beats on both VRAM (less) and tokens/s (more), by VRAM."""
    ok = sorted((r for r in rows if r.tokens_per_s is not None),
                key=lambda r: (r.option.vram_gib, -(r.tokens_per_s or 0.0)))
    front: list[Row] = []
    for r in ok:
        assert r.tokens_per_s is not None
        if not front or r.tokens_per_s > (front[-1].tokens_per_s or 0.0):
            front.append(r)
    return front


def mark(rows: list[Row]) -> None:
    """Set ``pareto`` (per weight width) and ``best`` (the fastest of each width)."""
    for bits in dict.fromkeys(r.option.shape.bits for r in rows):
        group = [r for r in rows if r.option.shape.bits == bits]
        for r in pareto(group):
            r.pareto = True
        ok = [r for r in group if r.tokens_per_s is not None]
        if ok:
            max(ok, key=lambda r: (r.tokens_per_s or 0.0, -r.option.vram_gib)).best = True


def calibration_lines(req: AdviseRequest, base: dict[str, Any], options: list[Option]) -> list[str]:
    """Where the predictions' numbers come from: the GPU's link, memory and compute, the host
    CPU, each runtime profile used, and a fit's held-out error."""
    from moesim.sim.config.catalog import get_runtime, load_spec_file
    from moesim.sim.config.scenario import load_scenario_data

    loaded = load_scenario_data(copy.deepcopy(base), source="simctl advise", base_dir=Path.cwd())
    hw = loaded.hardware_spec()
    where = Path(req.gpu).name if req.gpu.endswith((".yaml", ".yml")) else f"catalog entry {req.gpu}"
    lines = [f"hardware {hw.name} ({where}): {hw.source or 'no source stated'}"]
    for f, unit in (("pcie_gbps", "GB/s pinned"), ("pageable_gbps", "GB/s pageable"), ("hbm_gbps", "GB/s HBM"),
                    ("peak_tflops", "TFLOP/s")):
        value = getattr(hw, f) if f != "pageable_gbps" else hw.pageable_rate_gbps
        lines.append(f"  {f} {value:g} {unit}: {hw.source_of(f, where)}")
    cpu = hw.cpu
    lines.append(f"  host cpu {cpu.name}: {cpu.mem_gbps:g} GB/s, {cpu.cores} cores: {cpu.source or 'no source stated'}")
    if req.runtime:
        rt = get_runtime(load_spec_file(Path(req.runtime), "runtime"))
        lines.append(f"runtime (every system) {rt.name} ({req.runtime}): {rt.source or 'no source stated'}")
    else:
        for name in dict.fromkeys(o.runtime for o in options):
            users = ", ".join(dict.fromkeys(o.system for o in options if o.runtime == name))
            rt = get_runtime(name)
            lines.append(f"runtime {name} ({users}): {rt.source or 'no source stated'}")
    for label, path in (("calibration", req.calibration), ("--gpu", req.gpu), ("--runtime", req.runtime)):
        held = fit_error(path) if path else None
        if held:
            lines.append(f"{label} {Path(path or '').name}: {held}")
    if not any("held-out" in line for line in lines):
        lines.append("held-out error: none known (no `simctl fit` file given; the catalog figures are spec "
                     "sheets and derivations, not fitted to this machine)")
    return lines


def fit_error(path: str) -> str | None:
    """A ``simctl fit`` file's name, source and held-out error in one line (None for any other file)."""
    from moesim.sim.core.yamlio import YamlError, load_yaml_file

    if not path.endswith((".yaml", ".yml")) or not Path(path).is_file():
        return None
    try:
        data = load_yaml_file(Path(path))
    except YamlError:
        return None
    fit = data.get("fit") if isinstance(data, dict) else None
    if not isinstance(fit, dict):
        return None
    held = fit.get("held_out") or {}
    if isinstance(held, dict) and held.get("rows"):
        err = (f"held-out error over {held['rows']} rows: median {held.get('median_abs_error_pct', float('nan')):.1f}%, "
               f"max ratio {held.get('max_ratio', float('nan')):.2f}x")
    else:
        err = "held-out error: the fit held out no rows"
    return f"fit {fit.get('name', '?')} ({fit.get('source', 'no source')}): {err}"


def run_advice(req: AdviseRequest, out: Path, *, jobs: int | None = None, dask: str | None = None,
               progress: bool | str = False, force: bool = False, home: Path | None = None) -> Advice:
    """Search every option that fits: simulate them as sweep points in ``out`` (reused when
    already there) and mark the best and the Pareto front. ``home`` (``advise --out``, holding
    ``out``) is made an advice folder (:func:`moesim.sim.core.atomic.own_folder`) once the
    request is known to be valid."""
    from moesim.sim.core.atomic import own_folder
    from moesim.sim.study.sweep_run import PointStore, run_sweep

    base, options, workload, notes = build(req)
    sweep = to_sweep(req, base, options)
    calib = calibration_lines(req, base, options)
    if home is not None:
        own_folder(home, option="--out", kind="advise", accept=("advise",))
    outcome = run_sweep(sweep, out, jobs=jobs, dask=dask, progress=progress, force=force)
    records = PointStore(out).load()
    rows = []
    for point, option in zip(sweep.points, options, strict=True):
        rec = records.get(point.config_hash, {})
        tps = rec.get("metrics", {}).get("tokens_per_s") if rec.get("status") == "ok" else None
        rows.append(Row(option, float(tps) if tps is not None else None, rec.get("status", "missing"), rec.get("error")))
    mark(rows)
    notes = notes + [f"VRAM used = non-expert weights + experts on the GPU + {req.reserve_gib:g} GiB reserve (CUDA "
             f"context, KV cache, activations); host = what the system keeps there + {req.host_reserve_gib:g} GiB "
             "reserve"]
    return Advice(rows, calib, workload, notes, points_run=outcome.ran, points_reused=outcome.skipped)


__all__ = ["AdviseError", "AdviseRequest", "Advice", "Row", "build", "run_advice", "pareto", "mark"]
