"""``simctl advise``: which offloading system and which settings for a given model, GPU and
memory, by simulating every setting that fits.

The options (:mod:`moesim.sim.study.advise_options`) become the points of one sweep (a zipped
axis of policy, expert budget, runtime and model), run by the sweep machinery
(:func:`moesim.sim.study.sweep_run.run_sweep`: a point file per option, so a run given the same
``--out`` again reuses every finished point; a process pool or Dask; a progress bar). The
result is one row per option (system, setting as the tool spells it, VRAM used, host memory
used, tokens/s and the error band of the published rows nearest to it,
:mod:`moesim.sim.study.advise_bands`), the best option per weight width with the options tied
with it (within the error bands), the Pareto front of VRAM against speed, the caveats (options
resting on unmerged upstream features, the host assumed) and the calibration the predictions
rest on.

Without ``--bits`` every width is considered: the model's own, then llama.cpp's Q8_0 and Q4_K
sizes below it, each with the memory it takes (a width where nothing fits says what it needs).

The default workload is short, so that the whole search takes seconds: the model's synthetic
preset (or default knobs), 3 requests of 16 prompt and 64 generated tokens; the first request
is the offline profile (Fiddler's popularity), the other two are decoded at batch 1.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.study import advise_ktransformers, advise_nkvo
from moesim.sim.study.advise_bands import Band
from moesim.sim.study.advise_calibration import calibration_lines
from moesim.sim.study.advise_host import CPU_EXPERT_POLICIES, cpu_words, numa_caveats
from moesim.sim.study.advise_inputs import (
    AdviseError,
    at_width,
    hardware_ref,
    model_ref,
    runtime_file,
    synthetic_trace,
)
from moesim.sim.study.advise_options import (
    HOST_KV_FLAG,
    RUNTIMES,
    SYSTEMS,
    Memory,
    Option,
    Shape,
    all_options,
    least_needed,
)

if TYPE_CHECKING:
    from moesim.sim.config.catalog import CpuSpec

REQUESTS, PROMPT, DECODE = 3, 16, 64
# Widths tried besides the model's own when the user gives no --bits (those below it):
# llama.cpp's Q8_0 (blocks of 32 int8 weights and one fp16 scale: 34 bytes per 32 weights =
# 8.5 bits) and Q4_K (super-blocks of 256 weights in 144 bytes = 4.5 bits), ggml's block formats.
FALLBACK_BITS = {8.5: "Q8_0", 4.5: "Q4_K"}
TIE_FLOOR = 0.01
"""Where an option has no error band, predictions within 1% are ties (one seed's resolution, as
``simctl compare`` ranks single-seed results)."""


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
    merged_only: bool = False
    context_tokens: int = 0
    """Tokens in each request's context before it decodes (``--context``): the KV cache of
    ``batch`` such requests takes VRAM and attention reads it; 0: the reserve stands for the KV
    cache (the behaviour before ``--context``)."""
    batch: int = 1
    """Requests decoded together (``--batch``)."""


@dataclass
class Row:
    """One simulated option."""

    option: Option
    tokens_per_s: float | None
    status: str
    error: str | None = None
    pareto: bool = False
    best: bool = False
    tie: bool = False
    """Within the error bands of its width's best (the best itself when it has such rows)."""
    band: Band | None = None

    def mark(self) -> str:
        """The table's mark: ``best``, ``tie`` (the best when others tie with it: ``tie, fastest``),
        ``front`` or nothing."""
        if self.best:
            return "tie, fastest" if self.tie else "best"
        return "tie" if self.tie else ("front" if self.pareto else "")


@dataclass
class Advice:
    """The outcome: rows in option order, calibration lines, the workload said in words."""

    rows: list[Row]
    calibration: list[str]
    workload: str
    notes: list[str] = field(default_factory=list)
    points_run: int = 0
    points_reused: int = 0
    caveats: list[str] = field(default_factory=list)
    model_name: str = ""

    def ok(self) -> list[Row]:
        """Rows that ran."""
        return [r for r in self.rows if r.tokens_per_s is not None]

    def best(self) -> list[Row]:
        """The best row of each weight width."""
        return [r for r in self.ok() if r.best]


# --- inputs ---------------------------------------------------------------------------------------
def _shape(ref: dict[str, Any], name: str, bits: float | None) -> tuple[Shape, dict[str, Any]]:
    """The model at ``bits`` per weight (None: its own width) and its scenario reference."""
    ref, m = at_width(ref, bits)
    shape = Shape(name, m.num_layers, m.num_experts, int(m.expert_bytes), int(m.non_expert_bytes),
                  bits if bits is not None else m.dtype_bytes * 8, m.dense_blocks)
    return shape, {k: v for k, v in ref.items() if k != "dense_blocks"}


def _trace(req: AdviseRequest, ref: dict[str, Any], name: str) -> tuple[str | dict[str, Any], str]:
    """The scenario's trace and the workload in words."""
    n = req.decode_tokens
    if req.trace is not None:
        path = Path(req.trace)
        if not path.is_file():
            raise AdviseError(f"--trace {req.trace}: no such file")
        return str(path.resolve()), (f"{path.name}: its first request is the offline profile, the next two are "
                                     f"decoded at batch 1 (decode only)")
    if req.batch > 1 or req.context_tokens:
        count = 1 + max(REQUESTS - 1, req.batch)
        trace, what = synthetic_trace(ref, name, count, PROMPT, n)
        return trace, (f"{what}: {count} requests of {PROMPT} prompt and {n} generated tokens; the first is the "
                       f"offline profile, the other {count - 1} are decoded {req.batch} at a time (decode only) from "
                       f"a context of {req.context_tokens} tokens each")
    trace, what = synthetic_trace(ref, name, REQUESTS, PROMPT, n)
    return trace, (f"{what}: {REQUESTS} requests of {PROMPT} prompt and {n} generated tokens; the "
                   f"first is the offline profile (Fiddler's popularity), the other {REQUESTS - 1} "
                   f"are decoded one at a time (batch 1, decode only, {(REQUESTS - 1) * n} tokens)")


def kv_gib(req: AdviseRequest, ref: dict[str, Any]) -> float:
    """GiB of KV cache the advised workload holds at its peak: ``batch`` requests of
    ``context_tokens`` plus the generated tokens each, over every attention layer (0 without
    ``--context``)."""
    if not req.context_tokens:
        return 0.0
    from moesim.sim.config.catalog import get_model

    m = get_model(ref)
    if m.kv_bytes_per_token is None:
        raise AdviseError(f"--context: model {m.name} gives no attention shape (attention_heads with kv_heads and "
                          "head_dim, or kv_lora_rank): its KV cache cannot be sized")
    tokens = req.batch * (req.context_tokens + req.decode_tokens)
    return tokens * m.kv_bytes_per_token * m.attention_blocks / 2**30


def widths(native: float, given: list[float] | None) -> list[float | None]:
    """The widths to try: ``given``, else the model's own (None) and each of
    :data:`FALLBACK_BITS` below it."""
    if given:
        return list(given)
    return [None, *(b for b in FALLBACK_BITS if b < native - 1e-9)]


def _calibration_key_known() -> bool:
    from moesim.sim.config.scenario import Scenario

    return "calibration" in Scenario.model_fields


def build(req: AdviseRequest) -> tuple[dict[str, Any], list[Option], str, list[str]]:
    """The base scenario, every option that fits, the workload in words and notes on what was
    assumed, per weight width: without ``bits`` every width of :func:`widths` is tried, each
    with its own options (a width where nothing fits gets a note of what it needs). Bad input,
    or no option that fits at any width, raises :class:`AdviseError`."""
    for name, value in (("--vram", req.vram_gib), ("--host-mem", req.host_gib)):
        if not (value > 0 and math.isfinite(value)):
            raise AdviseError(f"{name} {value:g}: must be a positive number of GiB")
    unknown = [s for s in req.systems or [] if s not in SYSTEMS]
    if unknown:
        raise AdviseError(f"--systems {','.join(unknown)}: unknown; known: {', '.join(SYSTEMS)}")
    if req.runtime is not None:
        runtime_file(req.runtime)
    if req.calibration is not None:
        if not Path(req.calibration).is_file():
            raise AdviseError(f"--calibration {req.calibration}: no such file")
        if not _calibration_key_known():
            raise AdviseError("--calibration: this moesim has no `calibration:` scenario key (simctl fit); give the "
                              "fitted file as --gpu (its hardware section) or --runtime instead")
    for given in req.bits or []:
        if not (0 < given <= 32):
            raise AdviseError(f"--bits {given:g}: expected bits per weight in (0, 32]")
    hw = hardware_ref(req.gpu, req.cpu, req.vram_gib)
    ref, name = model_ref(req.model)
    trace, workload = _trace(req, ref, name)
    if req.context_tokens < 0 or req.batch < 1:
        raise AdviseError("--context must be >= 0 and --batch >= 1")
    kv = kv_gib(req, ref)
    from moesim.sim.config.catalog import get_hardware

    mem = Memory(req.vram_gib, req.host_gib, req.reserve_gib, req.host_reserve_gib, kv,
                 numa_nodes=get_hardware(hw).cpu.sockets)
    notes: list[str] = []
    options: list[Option] = []
    shortfall = []
    from moesim.sim.config.catalog import get_model

    native = get_model(ref).dtype_bytes * 8
    for bits in widths(native, req.bits):
        shape, at = _shape(ref, name, bits)
        found = all_options(shape, mem, req.systems, req.merged_only)
        for o in found:
            o.model = at
        options += found
        size = f" (the size of llama.cpp's {FALLBACK_BITS[bits]})" if bits in FALLBACK_BITS else ""
        own = " (the model's own)" if bits is None else ""
        if found:
            vram = [o.vram_gib for o in found]
            notes.append(f"at {shape.bits:g} bits per weight{own}{size}: {len(found)} options, {min(vram):.1f}-"
                         f"{max(vram):.1f} GiB of VRAM; experts {shape.routed_bytes / 2**30:.1f} GiB, other weights "
                         f"{shape.non_expert_bytes / 2**30:.1f} GiB")
        else:
            shortfall.append(least_needed(shape, mem, host_kv=req.systems is None or "cpu-moe" in req.systems))
            notes.append(f"at {shape.bits:g} bits per weight{own}{size}: nothing fits ({shortfall[-1]})")
    if not options:
        raise AdviseError(f"nothing fits {req.vram_gib:g} GiB of VRAM and {req.host_gib:g} GiB of host memory: "
                          + "; ".join(shortfall))
    if req.bits is None:
        notes.append("every width above is considered (a narrower width is not marked down for quality); "
                     "--bits 16,8.5 chooses")
    base: dict[str, Any] = {
        "name": f"advise-{name}", "trace": trace, "hardware": hw,
        "model": req.model if ref == {"base": req.model} else {k: v for k, v in ref.items() if k != "dense_blocks"},
        "cache": {"experts_per_layer": 1}, "policy": "lru", "runtime": "none",
        "profile": {"requests": 1}, "workload": {"batch_size": req.batch, "phases": ["decode"]}, "seed": 0}
    if req.context_tokens:
        base["workload"]["context_tokens"] = req.context_tokens
    if req.calibration is not None:
        base["calibration"] = str(Path(req.calibration).resolve())
    return base, options, workload, notes


def _runtime(option: Option, user: dict[str, Any] | None, path: str | None) -> str | dict[str, Any]:
    """The scenario's ``runtime:`` of an option: its own (:attr:`Option.runtime_ref`), or the
    user's ``--runtime`` file (``path``, its spec ``user``) with the option's overrides
    (:attr:`Option.runtime_overrides`: ``kv_on_host`` for llama.cpp's ``-nkvo``, kTransformers'
    eager launches without its CUDA graph), so that the user's runtime is changed where the
    setting changes it, not replaced."""
    if user is None or path is None:
        return option.runtime_ref
    return {**user, **option.runtime_overrides} if option.runtime_overrides else str(Path(path).resolve())


def to_sweep(req: AdviseRequest, base: dict[str, Any], options: list[Option]) -> Any:
    """The options as the points of one sweep (one zipped axis, in option order)."""
    from moesim.sim.study.sweep import SweepError, SweepSpec, expand

    user = runtime_file(req.runtime) if req.runtime else None   # read once for every option
    spec = SweepSpec(name=str(base["name"]), base=copy.deepcopy(base), zip={
        "policy": [{"name": o.policy, "params": o.params} for o in options],
        "cache.experts_per_layer": [o.experts_per_layer for o in options],
        "runtime": [_runtime(o, user, req.runtime) for o in options],
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


def likely_speed(r: Row, floor: float = TIE_FLOOR) -> float:
    """The speed a row's prediction most likely stands for: the middle (geometric) of the speeds
    its error band allows (:meth:`Band.interval`); the prediction itself without a band. A
    system whose published rows came out twice too fast is not the fastest for a prediction
    that only its optimism puts first."""
    lo, hi = (r.band or Band(None, None, 0, "")).interval(r.tokens_per_s or 0.0, floor)
    return math.sqrt(lo * hi)


def mark(rows: list[Row], floor: float = TIE_FLOOR) -> None:
    """Set ``pareto`` (per weight width), ``best`` (the fastest of each width by the speed its
    prediction most likely stands for, :func:`likely_speed`) and ``tie``: a row whose error band
    reaches the best's (the fastest speed it may stand for, its prediction over its band's low
    end, at or above the slowest the best may stand for, the best's over its high end; ``floor``
    either way for a row without a band), and the best itself when it has ties."""
    for bits in dict.fromkeys(r.option.shape.bits for r in rows):
        group = [r for r in rows if r.option.shape.bits == bits]
        for r in pareto(group):
            r.pareto = True
        ok = [r for r in group if r.tokens_per_s is not None]
        if not ok:
            continue
        best = max(ok, key=lambda r: (likely_speed(r, floor), r.tokens_per_s or 0.0, -r.option.vram_gib))
        best.best = True
        nothing = Band(None, None, 0, "")
        slowest, _ = (best.band or nothing).interval(best.tokens_per_s or 0.0, floor)
        for r in ok:
            if r is not best and (r.band or nothing).interval(r.tokens_per_s or 0.0, floor)[1] >= slowest:
                r.tie = best.tie = True


def fitted_band(req: AdviseRequest) -> tuple[str, str, Band] | None:
    """The flag, file and held-out error of the first ``simctl fit`` file given (``--calibration``,
    ``--gpu``, ``--runtime``) that has one, which then gives every option's band; else None."""
    from moesim.sim.study.advise_bands import fit_band

    for flag, path in (("--calibration", req.calibration), ("--gpu", req.gpu), ("--runtime", req.runtime)):
        if path and path.endswith((".yaml", ".yml")) and Path(path).is_file():
            band = fit_band(path)
            if band is not None:
                return flag, path, band
    return None


def bands(req: AdviseRequest, options: list[Option], hbm_gbps: float) -> tuple[list[Band], str]:
    """Each option's error band and a line saying where the bands come from: the held-out error
    of the first ``simctl fit`` file given that has one (:func:`fitted_band`), else the published
    rows of each system predicted with the option's runtime (``--runtime`` when given; an option
    that keeps the KV cache in host memory, on the rows that did too where there are some) on GPUs
    of this one's class (:func:`moesim.sim.study.advise_bands.catalog_band`)."""
    from moesim.sim.study.advise_bands import CLASS_WORDS, catalog_band, gpu_class

    fitted = fitted_band(req)
    if fitted is not None:
        flag, path, band = fitted
        return [band] * len(options), f"error bands: {flag} {Path(path).name}'s own held-out error, {band.words}"
    cls = gpu_class(hbm_gbps)
    return ([catalog_band(o.band_system, o.system, cls, runtime=req.runtime or o.runtime, host_kv=o.kv_on_host)
             for o in options],
            f"error bands: predicted / published tokens/s of each system's published rows (this GPU is of the "
            f"{CLASS_WORDS[cls]}: {hbm_gbps:g} GB/s), from sim/study/advise_bands.csv "
            "(python benchmarks/advise_bands.py); a band is no guarantee for a machine unlike theirs")


def caveats(req: AdviseRequest, rows: list[Row], cpu: CpuSpec, gpu_class: str = "gddr", hw: Any = None) -> list[str]:
    """What the answer assumes that the user may not: options resting on unmerged upstream
    features, llama.cpp's pageable copies under its default mmap, its ``-nkvo`` options'
    attention on the CPU (:func:`moesim.sim.study.advise_nkvo.caveats`, given the GPU ``hw``),
    the host assumed, a NUMA-unaware system read at a multi-socket host's full rate,
    kTransformers' threads, NUMA copies, kernels and band
    (:func:`moesim.sim.study.advise_ktransformers.caveats`, on a GPU of ``gpu_class``) or why it
    has no options, the error bands' reach."""
    cpu_name, words = cpu.name, cpu_words(cpu)
    out = []
    unmerged = dict.fromkeys(r.option.unmerged for r in rows if r.option.unmerged)
    for why in unmerged:
        n = sum(1 for r in rows if r.option.unmerged == why)
        out.append(f"unmerged upstream: {n} options marked [unmerged]: {why} (--merged-only leaves them out)")
    if req.merged_only:
        out.append("--merged-only: options that need an unmerged upstream feature were left out")
    llama = [r for r in rows if r.option.system == SYSTEMS["cpu-moe"]]
    dense = {r.option.shape.dense_blocks for r in llama} - {0}
    for d in dense:
        out.append(f"llama.cpp's --n-cpu-moe counts transformer blocks, and this model's first {d} "
                   f"block{'s are' if d > 1 else ' is'} dense: each --n-cpu-moe printed is the MoE layers on the CPU "
                   f"+ {d}, ready to paste")
    if llama:
        out.append("llama.cpp loads by mmap unless --no-mmap: its CPU layers' experts then stay in pageable memory "
                   "(src/llama-model-loader.cpp), so what it copies of them (prompt batches of 32 tokens or more, "
                   "--moe-expert-cache uploads) is priced at the GPU's pageable rate; --no-mmap would pin them "
                   "(simctl policies cpu-moe: mmap)")
    if hw is not None:
        from moesim.sim.config.catalog import get_runtime

        band_runtime = None if fitted_band(req) else req.runtime or RUNTIMES["cpu-moe"]
        ran = get_runtime(runtime_file(req.runtime) if req.runtime else RUNTIMES["cpu-moe"])   # what -nkvo options run
        out += advise_nkvo.caveats(cpu, hw, [r.option for r in rows], gpu_class, band_runtime, ran)
    if req.cpu is None and cpu_name == "default":
        on_cpu = [s for s in ("llama.cpp", "Fiddler", "kTransformers") if s.lower() in {r.option.system for r in rows}]
        who = " and ".join([", ".join(on_cpu[:-1]), on_cpu[-1]] if len(on_cpu) > 1 else on_cpu) or "llama.cpp and Fiddler"
        out.append(f"host assumed: {words} (no --cpu given; the experts {who} run{'s' if len(on_cpu) == 1 else ''} on "
                   "the CPU are timed on it): name yours with --cpu NAME (simctl hardware lists the hosts) or a --gpu "
                   "hardware file with a cpu: section")
    cpu_systems = [(r.option.system, r.option.runtime) for r in rows if r.option.policy in CPU_EXPERT_POLICIES]
    out += numa_caveats(cpu, cpu_systems, req.runtime)
    if req.systems is None or "ktransformers" in req.systems:
        name = rows[0].option.shape.name if rows else ""
        if name and advise_ktransformers.rules_file(name) is None:
            out.append(advise_ktransformers.unsupported_note(name))
        elif (short := advise_ktransformers.shortfall_note([r.option for r in rows])) is not None:
            out.append(short)
        out += advise_ktransformers.caveats(cpu, [r.option for r in rows], gpu_class)
    return out


def run_advice(req: AdviseRequest, out: Path, *, jobs: int | None = None, dask: str | None = None,
               progress: bool | str = False, force: bool = False, home: Path | None = None) -> Advice:
    """Search every option that fits: simulate them as sweep points in ``out`` (reused when
    already there) and mark the best and the Pareto front. ``home`` (``advise --out``, holding
    ``out``) is made an advice folder (:func:`moesim.sim.core.atomic.own_folder`) once the
    request is known to be valid."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.core.atomic import own_folder
    from moesim.sim.study.sweep_run import PointStore, run_sweep

    base, options, workload, notes = build(req)
    sweep = to_sweep(req, base, options)
    calib = calibration_lines(req, base, options)
    hw = load_scenario_data(copy.deepcopy(base), source="simctl advise", base_dir=Path.cwd()).hardware_spec()
    row_bands, band_line = bands(req, options, hw.hbm_gbps)
    if home is not None:
        own_folder(home, option="--out", kind="advise", accept=("advise",))
    outcome = run_sweep(sweep, out, jobs=jobs, dask=dask, progress=progress, force=force)
    records = PointStore(out).load()
    rows = []
    for point, option, band in zip(sweep.points, options, row_bands, strict=True):
        rec = records.get(point.config_hash, {})
        tps = rec.get("metrics", {}).get("tokens_per_s") if rec.get("status") == "ok" else None
        rows.append(Row(option, float(tps) if tps is not None else None, rec.get("status", "missing"), rec.get("error"),
                        band=band))
    mark(rows)
    if req.context_tokens:
        kv = kv_gib(req, model_ref(req.model)[0])
        vram_line = (f"VRAM used = non-expert weights + experts on the GPU + the KV cache ({kv:.2f} GiB: {req.batch} x "
                     f"({req.context_tokens} + {req.decode_tokens}) tokens) + {req.reserve_gib:g} GiB reserve (CUDA "
                     "context, activations, compute buffers: not KV)")
        if any(o.kv_on_host for o in options):
            vram_line += (f"; llama.cpp's {HOST_KV_FLAG} options count the KV cache in host memory instead")
    else:
        vram_line = (f"VRAM used = non-expert weights + experts on the GPU + {req.reserve_gib:g} GiB reserve (CUDA "
                     "context, KV cache, activations)")
    notes = notes + [f"{vram_line}; host = what the system keeps there + {req.host_reserve_gib:g} GiB reserve"]
    from moesim.sim.study.advise_bands import gpu_class

    found = caveats(req, rows, hw.cpu, gpu_class(hw.hbm_gbps), hw) + [band_line]
    return Advice(rows, calib, workload, notes, points_run=outcome.ran, points_reused=outcome.skipped, caveats=found,
                  model_name=model_ref(req.model)[1])


__all__ = ["AdviseError", "AdviseRequest", "Advice", "Row", "bands", "build", "caveats", "fitted_band", "likely_speed", "mark", "pareto", "run_advice",
           "widths"]
