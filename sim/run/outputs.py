"""Run outputs (docs/contract.md, "Outputs"): the one-screen summary, ``config.yaml``,
``metrics.json``, ``steps.parquet`` and ``timeline.json`` (Chrome trace / Perfetto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from rich.console import Console
from rich.table import Table

from moesim.sim.config.catalog import RuntimeSpec
from moesim.sim.core.atomic import atomic_folder
from moesim.sim.core.escape import terminal as escape  # control characters shown, markup escaped
from moesim.sim.engine.records import STEP_FIELDS
from moesim.sim.run.metrics import cache_start
from moesim.sim.run.runner import RunResult
from moesim.traces.format.arrow_numpy import from_numpy

STEPS_ROW_GROUP = 1 << 20
"""Rows per row group of ``steps.parquet`` (pyarrow's default, named so that the file does not
change with pyarrow's): it is written one row group at a time."""


def steps_table(result: RunResult, start: int = 0, stop: int | None = None) -> pa.Table:
    """Per (iteration, layer), of the steps ``start:stop`` (all by default): times and stalls
    in microseconds, access counts, bytes moved."""
    out: dict[str, Any] = {}
    for name, _ in STEP_FIELDS:
        col = result.steps[name][start:stop]
        if name in ("t_start", "t_route", "t_end", "stall_s"):
            key = "stall_us" if name == "stall_s" else f"{name}_us"
            out[key] = from_numpy(np.asarray(col, dtype=np.float64) * 1e6)
        else:
            out[name] = from_numpy(np.asarray(col, dtype=np.int64))
    return pa.table(out)


STEPS_NO_DICTIONARY = ("t_start_us", "t_route_us", "t_end_us")
"""Columns of ``steps.parquet`` written without a dictionary: every step has times of its own,
so a dictionary of them never pays (pyarrow built one for each column until it outgrew its
page, then wrote plain values: half the file's writing time). The other columns, a few distinct
counts (and stalls, mostly 0), keep theirs. The table read back is the same either way."""


def write_steps(result: RunResult, path: Path) -> None:
    """``steps.parquet``: the file :func:`steps_table` of every step would make, converted and
    written one row group at a time (a 3M-step run's whole table is ~360 MB of 64-bit
    columns; a row group's is ~130 MB)."""
    rows = len(result.steps[STEP_FIELDS[0][0]]) if result.steps else 0
    first = steps_table(result, 0, STEPS_ROW_GROUP)
    dictionary = [name for name in first.schema.names if name not in STEPS_NO_DICTIONARY]
    with pq.ParquetWriter(path, first.schema, compression="zstd", use_dictionary=dictionary) as writer:
        writer.write_table(first, row_group_size=STEPS_ROW_GROUP)
        del first
        for start in range(STEPS_ROW_GROUP, rows, STEPS_ROW_GROUP):
            writer.write_table(steps_table(result, start, start + STEPS_ROW_GROUP), row_group_size=STEPS_ROW_GROUP)


CPU_TRACKS = {"GPU": "CPU compute", "PCIe D2H": "memcpy back", "PCIe H2D": "memcpy"}
"""The timeline's track names for a run whose device is the CPU (``hardware.device: cpu``): the
engine records ``GPU``, ``PCIe H2D <lane>`` and ``PCIe D2H``, which on the CPU are its own compute
and memory copies (a prefix is replaced, so ``PCIe H2D 0`` is ``memcpy 0``)."""

COMPUTE_TRACKS = ("GPU", CPU_TRACKS["GPU"])
"""The device's compute track under either name (the timeline view colours its spans by kind)."""


def track_name(track: str, device: str) -> str:
    """The name a timeline track is shown with on ``device`` (``gpu``: as recorded)."""
    if device != "cpu":
        return track
    for prefix, name in CPU_TRACKS.items():
        if track == prefix or track.startswith(prefix + " "):
            return name + track[len(prefix):]
    return track


def chrome_trace(result: RunResult, name: str) -> dict[str, Any]:
    """The recorded device, host CPU and copy-lane activity as a Chrome trace (opens in
    Perfetto), the tracks named for the device that ran (:func:`track_name`)."""
    tracks: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    device = str(result.config.get("resolved", {}).get("hardware", {}).get("device", "gpu"))
    for track, label, start, dur, args in result.timeline:
        tid = tracks.setdefault(track_name(track, device), len(tracks) + 1)
        events.append({"name": label, "ph": "X", "pid": 1, "tid": tid, "ts": start * 1e6,
                       "dur": dur * 1e6, "args": args})
    meta = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"moesim: {name}"}}]
    for track, tid in tracks.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_outputs(result: RunResult, out_dir: str | Path, *, timeline: bool = True, force: bool = False) -> Path:
    """Write the run's files into the folder ``out_dir``, which must not exist or be empty
    unless ``force`` (then it is replaced). The files are written into a temporary sibling
    renamed at the end (:func:`moesim.sim.core.atomic.atomic_folder`): a failure or a kill leaves
    nothing under ``out_dir``."""
    out = Path(out_dir)
    with atomic_folder(out, option="--out", force=force, kind="run") as tmp:
        (tmp / "config.yaml").write_text(yaml.safe_dump(result.config, sort_keys=False))
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2, sort_keys=True) + "\n")
        write_steps(result, tmp / "steps.parquet")
        if timeline:
            (tmp / "timeline.json").write_text(json.dumps(chrome_trace(result, str(result.metrics.get("scenario")))))
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def binary_size(n_bytes: float) -> str:
    """Bytes in the unit that shows them (GiB, MiB, KiB): a small model's 1.2 MiB budget is not
    ``0.00 GiB``."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= 0.1 * size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def decimal_size(n_gb: float) -> str:
    """Gigabytes (1e9 bytes: copy volumes, as bandwidths are counted) in the unit that shows them."""
    for unit, scale in (("GB", 1.0), ("MB", 1e-3), ("kB", 1e-6)):
        if n_gb >= 0.1 * scale:
            return f"{n_gb / scale:.3g} {unit}"
    return f"{n_gb * 1e9:.0f} B"


LABELS = {
    "gpu": {"compute": "GPU", "link": "PCIe", "memory": "VRAM"},
    "cpu": {"compute": "compute", "link": "copies", "memory": "memory"},
}
"""The summary's words for the device, by ``hardware.device``: a CPU run has no PCIe or VRAM."""


def policy_line(policy: dict[str, Any]) -> str:
    """``name (param value, ...)``, as the run resolved it."""
    params = policy.get("params") or {}
    text = ", ".join(f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}" for k, v in params.items())
    return policy["name"] + (f" ({text})" if text else "") + ("; oracle bound" if policy.get("bound") else "")


def cache_line(result: RunResult) -> str:
    """``16 of 64 experts per layer (25%), 0.52 GiB`` with the buffer, the initial content and
    swap-out when set."""
    r = result.config["resolved"]
    experts = result.model.num_experts
    per_layer = r["budget_experts_per_layer"]
    count = f"{per_layer:.0f}" if abs(per_layer - round(per_layer)) < 1e-9 else f"{per_layer:.2f}"
    text = (f"{count} of {experts} experts per layer ({per_layer / experts:.0%}), "
            f"{binary_size(r['budget_bytes'])}")
    if r["buffer_bytes"]:
        text += f"; transfer buffer {r['buffer_bytes'] / r['expert_bytes']:.0f} experts"
    cache = result.config.get("cache", {})
    initial = cache.get("initial", "empty")
    text += f"; starts {cache_start(initial)} ({initial})"
    if cache.get("swap_out"):
        text += "; swap-out" + (" (serial: one miss at a time)" if cache.get("serial_swap") else "")
    return text


RUNTIME_TIMES = ("layer_us", "iteration_us", "token_us", "demand_load_us", "prefetch_issue_us", "cpu_switch_us",
                 "pageable_copy_us")
"""The runtime profile's framework times; all zero (and no eager launches) means no framework
overhead is modelled."""


def runtime_line(runtime: dict[str, Any]) -> str:
    """``hf-eager: 350 us/layer (35 launches x 10 us), 1000 us/iteration, 0 us/token, 52 us per
    CPU-expert layer``, or, for a runtime with no time at all, that the run models no framework
    overhead (kernels back to back). The per-layer figure includes an eager layer's launches
    (not under ``cuda_graphs``; a prefill's are shown apart when the graphs cover decode only,
    ``eager_prefill``); the hand-off to CPU experts is shown when there is one, and a runtime
    that runs its CPU experts through its own kernel (``cpu_kernel``), copies from pageable host
    memory, runs the shared experts beside the CPU experts (``overlap_shared_experts``) or its
    attention on the host (``kv_on_host``), says so. ``runtime`` is the run's runtime as its
    result holds it (``RuntimeSpec.model_dump``)."""
    spec = RuntimeSpec.model_validate(runtime)
    launch_us = spec.launch_layer_us()
    prefill_us = spec.launch_layer_us(prefill=True) - launch_us   # the launches graphs skip in decode only
    if not any(getattr(spec, k) for k in RUNTIME_TIMES) and not launch_us and not prefill_us and not spec.kv_on_host:
        return f"{spec.name}: no framework overhead modelled (kernels back to back); name a runtime: to add one"
    layer = f"{spec.layer_us + launch_us:g} us/layer"
    if launch_us:
        layer += f" ({spec.layer_kernels} launches x {spec.launch_us:g} us)"
    if prefill_us:
        layer += f" (prefill: +{prefill_us:g}, {spec.layer_kernels} eager launches x {spec.launch_us:g} us)"
    text = f"{spec.name}: {layer}, {spec.iteration_us:g} us/iteration, {spec.token_us:g} us/token"
    if spec.cpu_switch_us:
        text += f", {spec.cpu_switch_us:g} us per CPU-expert layer"
    if spec.cpu_kernel is not None:
        text += (f", CPU experts by its own kernel ({spec.cpu_kernel.call_us:g} us a call, "
                 f"{spec.cpu_kernel.read_share:g} of the host's read rate)")
    if spec.host_memory == "pageable":
        text += ", copies from pageable host memory"
    if spec.overlap_shared_experts and spec.cuda_graphs:
        text += ", shared experts beside the CPU experts in graph-replayed one-token passes"
    if spec.kv_on_host:
        text += ", KV cache and attention on the host CPU (one more hand-off a layer)"
    return text


def speedup_line(speedups: list[Any]) -> str:
    """``2.31x over no-cache, 1.00x over lru (TPOT, same scenario)``, or why one is missing."""
    done = [f"{s.speedup:.2f}x over {s.baseline}" for s in speedups if s.speedup is not None]
    metric = next((s.metric for s in speedups), "TPOT")
    text = ", ".join(done) + (f" ({metric}, the same scenario)" if done else "")
    missing = [f"{s.baseline} {s.reason}" for s in speedups if s.speedup is None]
    return "; ".join([t for t in [text, *missing] if t])


def summary_table(result: RunResult, speedups: list[Any] | None = None) -> Table:
    """The one-screen summary: what ran (policy and its parameters, cache, trace, the speed-up
    over the baselines when ``speedups`` are given: :mod:`moesim.sim.run.baselines`), then the
    measurements, labelled for the device that ran (``hardware.device``)."""
    m = result.metrics
    r = result.config["resolved"]
    words = LABELS.get(r["hardware"].get("device", "gpu"), LABELS["gpu"])
    title = escape(f"{m['scenario']}: {m['policy']}") + (" (oracle bound)" if m["bound"] else "")
    t = Table(title=title, show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("policy", escape(policy_line(r["policy"])))
    for plugin in m.get("plugins", []):   # code of the user's that ran: which file, which bytes
        t.add_row("plugin code", escape(f"{plugin['file']} (sha256 {plugin['sha256']})"))
    t.add_row("cache", cache_line(result))
    if r.get("trace"):
        t.add_row("trace", escape(r["trace"]) + f"; {m['requests']} requests replayed")
    if speedups:
        t.add_row("speed-up", escape(speedup_line(speedups)))
    t.add_row("model / hardware", escape(f"{r['model']['name']} on {r['hardware']['name']}"))
    if r.get("runtime"):
        t.add_row("runtime", escape(runtime_line(r["runtime"])))
    if result.changes:
        t.add_row("overrides", escape("; ".join(result.changes)))
    for fit in m.get("fit", []):
        values = ", ".join(f"{k}={v:.6g}" for k, v in fit["values"].items())
        t.add_row("fitted", escape(f"{values} ({fit['via']}: {fit['file']}); {fit['summary']}"))
    t.add_row("tokens", f"{m['output_tokens']} output, {m['tokens']} processed, {m['requests']} requests, {m['iterations']} iterations")
    t.add_row("TTFT ms", f"mean {_fmt(m['ttft_ms']['mean'])}  p50 {_fmt(m['ttft_ms']['p50'])}  p99 {_fmt(m['ttft_ms']['p99'])}")
    t.add_row("TPOT ms", f"mean {_fmt(m['tpot_ms']['mean'])}  p50 {_fmt(m['tpot_ms']['p50'])}  p99 {_fmt(m['tpot_ms']['p99'])}")
    t.add_row("throughput", f"{m['tokens_per_s']:.1f} tokens/s over {m['sim_time_s']:.3f} s simulated")
    if "serving" in m:
        for label, value in serving_rows(m["serving"]):
            t.add_row(label, value)
    t.add_row("accesses", f"hit {m['hit_rate']:.2%}  late {m['late_rate']:.2%}  partial {m['partial_rate']:.2%}  miss {m['miss_rate']:.2%}  ({m['accesses']})")
    t.add_row("stall", f"{m['stall_ms']:.1f} ms ({m['stall_ms_per_token']:.3f} ms/token); {words['compute']} busy {m['gpu_busy_fraction']:.1%}")
    t.add_row(words["link"], f"{decimal_size(m['h2d_gb'])} host-to-device ({decimal_size(m['h2d_gb_per_token'])}/token), "
              f"busy {m['pcie_busy_ms']:.1f} ms; wasted prefetch {decimal_size(m['wasted_prefetch_gb'])}, "
              f"refetch {decimal_size(m['refetch_gb'])}"
              + (f"; swap-out {decimal_size(m['d2h_gb'])} back, busy {m['d2h_busy_ms']:.1f} ms" if m.get("d2h_gb") else ""))
    if m.get("fetch_precision") is not None:
        t.add_row("prefetch", f"precision {_fmt(m['fetch_precision'])}  recall {_fmt(m['prefetch_recall'])}")
    if "routing_mass_kept" in m:
        t.add_row("lossy", f"{m['substitutions_per_token']:.2f} substitutions/token, {m['dropped_per_token']:.2f} dropped/token, "
                  f"routing mass kept {m['routing_mass_kept']:.3f}, top-1 agreement {m['top1_agreement']:.3f}, "
                  f"effective top-k {m['effective_top_k']:.2f} (later routing replayed as recorded)")
    if m.get("cpu_expert_runs"):
        t.add_row("CPU experts", f"{m['cpu_expert_runs']} runs, busy {m['cpu_busy_ms']:.1f} ms, {words['compute']} waited {m['cpu_wait_ms']:.1f} ms")
    if m.get("runtime_overhead_ms") or m.get("policy_cpu_ms"):
        t.add_row("overhead", f"runtime {m['runtime_overhead_ms']:.1f} ms, policy decisions {m['policy_cpu_ms']:.1f} ms")
    t.add_row(f"{words['memory']} peak", f"{binary_size(m['vram_peak_gib'] * 1024**3)} "
              f"(experts {binary_size(m['expert_vram_peak_gib'] * 1024**3)})")
    # runtime.kv_on_host (llama.cpp's -nkvo): the KV cache is in host memory and takes no VRAM
    held = ("in host memory (runtime.kv_on_host), none of it in VRAM; {n} experts held" if (r.get("runtime") or {}).get(
        "kv_on_host") else "{n} experts held beside it")
    if "kv_gib" in m and "serving" in m:
        t.add_row("KV cache", f"{binary_size(m['kv_gib'] * 1024**3)} kept for the running batch at its bound "
                  f"({m['kv_peak_tokens']} tokens: the {m['serving']['max_batch']} largest requests' ends from a starting "
                  f"context of {m['context_tokens']}; live at most {m['serving']['kv_live_peak_tokens']}); "
                  + held.format(n=m['experts_held']))
    elif "kv_gib" in m:
        t.add_row("KV cache", f"{binary_size(m['kv_gib'] * 1024**3)} at its peak ({m['kv_peak_tokens']} tokens from a "
                  f"context of {m['context_tokens']}); " + held.format(n=m['experts_held']))
    elif "kv_cache" in m:
        t.add_row("KV cache", escape(m["kv_cache"]))
    if m.get("policy_report"):
        t.add_row("policy report", escape(", ".join(f"{k} {v}" for k, v in m["policy_report"].items())))
    if m.get("engine_path"):
        why = m.get("engine_path_reason")
        t.add_row("engine", f"{m['engine_path']} replay" + (f" (no fast replay: {escape(why)})" if why else ""))
    for w in m.get("warnings", []):
        t.add_row("[yellow]warning[/yellow]", escape(w))
    return t


def serving_rows(sv: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's rows for the ``serving`` block of a run with arrivals: the scheduler, the
    latency percentiles (from arrival), throughput and goodput."""
    def dist(d: dict[str, Any]) -> str:
        return "  ".join(f"{k} {_fmt(d[k])}" for k in ("p50", "p90", "p99"))

    sched = f"{sv['scheduler']}, max_batch {sv['max_batch']}" + (
        f", max_tokens {sv['max_tokens']}" if sv.get("max_tokens") else "")
    offered = f", offered {sv['offered_rps']:.3g} req/s" if sv.get("offered_rps") else ""
    rows = [("serving", f"{sched}; {sv['finished']} of {sv['requests']} requests finished{offered}"),
            ("TTFT ms (served)", dist(sv["ttft_ms"])),
            ("TPOT ms (served)", dist(sv["tpot_ms"]) + " (per request)"),
            ("E2E ms", dist(sv["e2e_ms"])),
            ("queueing ms", dist(sv["queue_ms"])),
            ("req throughput", f"{sv['requests_per_s']:.3g} requests/s, {sv['output_tokens_per_s']:.1f} output tokens/s")]
    if "goodput_rps" in sv:
        targets = ", ".join(f"{k} {v:g}" for k, v in sv["slo"].items())
        rows.append(("goodput", f"{sv['goodput_rps']:.3g} requests/s within the SLO ({targets}): "
                     f"{sv['slo_attainment']:.1%} of requests"))
    return rows


def print_summary(result: RunResult, console: Console | None = None, speedups: list[Any] | None = None) -> None:
    """Print :func:`summary_table`."""
    (console or Console()).print(summary_table(result, speedups))
