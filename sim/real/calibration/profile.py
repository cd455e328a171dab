"""Run the calibration for one model shape on one device and write the profile YAML.

The profile has ``hardware:`` (a :class:`~moesim.sim.config.catalog.HardwareSpec` with calibrated
``costs``, per-field ``sources``), ``runtime:`` (a :class:`~moesim.sim.config.catalog.RuntimeSpec`),
``model:`` (the shape it was measured for), ``provenance:`` (device, versions, date, command)
and ``measurements:`` (every raw timing, so a reader can redo the fits). Fits:

* copies: ``t = latency + bytes / bandwidth`` (least squares over sizes) -> ``pcie_latency_us``,
  ``pcie_gbps`` (``d2h_gbps`` from the reverse copies; on a GPU, ``pageable_gbps`` from the
  copies out of pageable host memory);
* the host CPU: one expert on the host's cores at ``--threads`` threads (the device's own
  expert runs on a CPU device; a separate run on a GPU's host) -> ``cpu.expert_us_by_tokens``
  (every token count's time, which the simulator interpolates: a host kernel need not be a line
  in tokens), ``cpu.expert_us``, ``cpu.expert_us_per_token`` (the line, for reading), and the
  read bandwidth those threads reached at one token ->
  ``cpu.mem_gbps`` (a lower bound for every core), ``cpu.thread_gbps``;
* expert: ``t = expert_us + expert_us_per_token * (n - 1)``, exact at one token (decode), the
  slope fitted over 2-128 tokens (prefill);
* non-MoE layer: ``t = layer_us + layer_us_per_token * (n - 1)`` at the calibration context
  (``--context``: the context the scenario decodes at; ``simctl validate`` passes its
  workload's), exact at one token; at one token against context (``--context`` and 2-4 times
  it) -> ``layer_us_per_context_token`` (the least-squares slope, 0 if negative), which the cost
  model charges per token of KV cache read when a scenario models the context
  (``workload.context_tokens``). ``layer_us`` itself is measured at ``--context`` and so holds
  that context's attention: a run that models the context counts those ``--context`` tokens
  once more (``--context`` x the slope: a few microseconds at the default 32);
* framework overhead (:mod:`moesim.sim.real.calibration.executor_runs`): the executor's own decode
  step with every expert resident, minus the summed parts (layers, experts, head) ->
  ``runtime.layer_us`` (the MoE block's dispatch and the policy's hooks, per layer); the
  stubbed forward pass minus its layers and head, against tokens -> ``runtime.iteration_us``
  and ``runtime.token_us`` (embedding, masks, rotary tables, the loop);
* demand loads: the executor's step with every access a demand load, against the resident
  one: what the simulator does not already predict from the copy and compute fits, per load
  -> ``runtime.demand_load_us``;
* prefetches: the executor's step with every expert brought in by an exact next-layer
  prefetch, against the resident one: the per-prefetch cost with which the simulator's step
  difference equals the measured one -> ``runtime.prefetch_issue_us``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from moesim.sim.config.catalog import GIB, ModelSpec, get_hardware, get_runtime
from moesim.sim.core.atomic import atomic_file
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.lib_warnings import quiet_library_warnings
from moesim.sim.real.calibration.awake import cpus_awake
from moesim.sim.real.calibration.bench import (
    copy_bench,
    expert_bench,
    head_bench,
    layer_bench,
    roofline_bench,
)
from moesim.sim.real.calibration.executor_runs import (
    calibration_workload,
    demand_load_cost,
    measure_runs,
    prefetch_issue_cost,
)
from moesim.sim.real.calibration.timing import best_of, fit_anchored, fit_line


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} logical CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory / GIB)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(int(line.split()[1]) * 1024 / GIB)
    except OSError:
        pass
    return 16.0


def provenance(device: torch.device, threads: int, command: str | None = None) -> dict[str, Any]:
    """Where the profile comes from: device, versions, date, command."""
    import transformers

    prov: dict[str, Any] = {
        "device": _device_name(device), "device_type": device.type, "torch": str(torch.__version__),
        "transformers": transformers.__version__, "python": platform.python_version(),
        "cuda": torch.version.cuda, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "host": platform.node(), "torch_threads": threads,
    }
    if device.type == "cuda":
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=False)
            prov["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, IndexError, ValueError):
            prov["driver"] = None
    return prov


@quiet_library_warnings()
def calibrate(om: Any, *, quick: bool = False, context: int = 32, threads: int = 1, seed: int = 0,
              command: str | None = None, routing: tuple[Any, list[int]] | None = None,
              keep_awake: bool = True) -> dict[str, Any]:
    """Measure everything for the prepared model ``om`` on its device; returns the profile
    (``command``: what produced it, for the provenance; default: this process's arguments;
    ``routing``: ``(trace, request ids)`` whose decode the executor-step runs replay, default
    random routing at ``context``; ``keep_awake``: on CPU, time with every processor kept out of
    idle, :mod:`moesim.sim.real.calibration.awake`)."""
    device = om.device
    old_threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    awake = contextlib.ExitStack()
    try:
        kept_awake = awake.enter_context(cpus_awake(device.type == "cpu" and keep_awake))
        m: ModelSpec = om.spec
        rep = 3 if quick else 9
        rounds = 1 if quick else 3
        eb = m.expert_bytes
        sizes = sorted({max(4096, eb // 64), max(4096, eb // 8), eb, 2 * eb} if quick else
                       {64 * 1024, max(4096, eb // 16), max(4096, eb // 4), eb, 2 * eb, 4 * eb})
        tokens = [1, 2, 8, 32] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
        contexts = [context] + ([4 * context] if quick else [2 * context, 4 * context])
        per_round: dict[str, list[Any]] = {"copies": [], "experts": [], "layers": [], "head": []}
        host = torch.device("cpu")
        if device.type != "cpu":
            per_round["host_experts"] = []
        for _ in range(rounds):   # rounds spread each point over time; each keeps its lowest median
            per_round["copies"].append(copy_bench(device, sizes, repeat=rep))
            per_round["experts"].append(expert_bench(device, om.hidden, om.inter, om.dtype, tokens, repeat=rep))
            if device.type != "cpu":   # the host's cores, at --threads threads
                torch.set_num_threads(threads)
                # weights pinned, as in the executor's host pool on a GPU machine
                per_round["host_experts"].append(expert_bench(host, om.hidden, om.inter, om.dtype, tokens, repeat=rep,
                                                              pin=True))
                torch.set_num_threads(old_threads)
            per_round["layers"].append(layer_bench(om, [1, 4, 32] if quick else [1, 2, 4, 8, 32, 128], contexts,
                                                   repeat=rep)["rows"])
            per_round["head"].append([{"s": head_bench(om, repeat=rep)}])
        copies = best_of(per_round["copies"], ("bytes", "host_memory"), ("h2d_s", "d2h_s"))
        experts = best_of(per_round["experts"], ("tokens", "dtype"), ("s",))
        host_experts = (best_of(per_round["host_experts"], ("tokens", "dtype"), ("s",))
                        if "host_experts" in per_round else experts)
        h0, h1 = fit_anchored([r["tokens"] - 1 for r in host_experts], [r["s"] for r in host_experts])
        pageable = [r for r in copies if r["host_memory"] == "pageable"]
        _, pg_per_byte = fit_line([r["bytes"] for r in pageable], [r["h2d_s"] for r in pageable]) if pageable else (0, 0)
        layer_rows = best_of(per_round["layers"], ("tokens", "context"), ("layer_s", "forward_s"))
        head = best_of(per_round["head"], (), ("s",))[0]["s"]
        main = [r for r in copies if r["host_memory"] in ("pinned", "memcpy")]
        lat, per_byte = fit_line([r["bytes"] for r in main], [r["h2d_s"] for r in main])
        dlat, dper = fit_line([r["bytes"] for r in main], [r["d2h_s"] for r in main])
        e0, e1 = fit_anchored([r["tokens"] - 1 for r in experts], [r["s"] for r in experts])
        roof = roofline_bench(device, om.dtype, size=256 if quick else 1024,
                              mem_bytes=(8 if quick else 64) * 2**20)
        at_ctx = [r for r in layer_rows if r["context"] == context]
        l0, l1 = fit_anchored([r["tokens"] - 1 for r in at_ctx], [r["layer_s"] for r in at_ctx])
        one = [r for r in layer_rows if r["tokens"] == 1]
        _, ctx_slope = fit_line([r["context"] for r in one], [r["layer_s"] for r in one])
        # the stubbed forward minus its layers and head: the per-pass overhead against tokens
        it_over = [r["forward_s"] - m.num_layers * r["layer_s"] - head for r in at_ctx]
        i0, i1 = fit_anchored([r["tokens"] for r in at_ctx], it_over)
        stub = next(r["forward_s"] for r in at_ctx if r["tokens"] == 1)
        workload = calibration_workload(m, routing, context=context, tokens=8 if quick else 24, seed=seed)
        runs = measure_runs(om, workload, seed, 2 if quick else 5)
        runs["routing"] = ("random" if routing is None else
                           f"decode of requests {list(routing[1])} of trace {routing[0].model.name!r}")
        step = runs["resident_s"]
    finally:
        torch.set_num_threads(old_threads)
        awake.close()
    L, k = m.num_layers, m.top_k
    token_s = i1
    iteration_s = max(0.0, i0)
    moe_overhead_s = max(0.0, (step - stub) / L - k * e0)
    us = 1e6
    prov = provenance(device, threads, command)
    prov["cpus_kept_awake"] = kept_awake
    where = f"calibration: measured on {prov['device']} ({prov['date']})"
    sources: dict[str, str] = {
        "pcie_gbps": f"{where}; least-squares fit of {len(main)} copy sizes through the executor's copy engine",
        "pcie_latency_us": f"{where}; intercept of the copy fit",
        "d2h_gbps": f"{where}; fit of the reverse copies",
        "copy_engines": "the executor's copy engine: one copy thread (CPU) or one CUDA copy stream",
        "device": f"{where}; the torch device type ({device.type})",
        "vram_gib": f"{where}; device memory (host memory when the device is the CPU)",
        "peak_tflops": f"{where}; {roof['matmul_size']}^3 matmul in {str(om.dtype).replace('torch.', '')}",
        "hbm_gbps": f"{where}; device-to-device copy of {roof['mem_bytes'] // 2**20} MiB, read + write",
        "kernel_us": "calibrated costs replace the roofline; no separate launch term",
        "evict_us": "not measured: the executor's eviction is bookkeeping inside the policy hooks",
        "costs": f"{where}; expert and non-MoE layer fits at context {context}; the context slope at one "
                 f"token over contexts {contexts}",
    }
    hw = {
        "name": f"calibrated-{device.type}",
        "device": "cpu" if device.type == "cpu" else "gpu",
        "vram_gib": round(_memory_gib(device), 3),
        "pcie_gbps": round(1 / per_byte / 1e9, 4) if per_byte > 0 else 1e3,
        "pcie_latency_us": round(lat * us, 3),
        "d2h_gbps": round(1 / dper / 1e9, 4) if dper > 0 else 1e3,
        "copy_engines": 1,
        "peak_tflops": round(roof["tflops"], 4),
        "hbm_gbps": round(roof["mem_gbps"], 3),
        "kernel_us": 0.0,
        "evict_us": 0.0,
        "costs": {"layer_us": round(l0 * us, 3), "layer_us_per_token": round(l1 * us, 3),
                  "expert_us": round(e0 * us, 3), "expert_us_per_token": round(e1 * us, 3),
                  "head_us": round(head * us, 3),
                  "layer_us_per_context_token": round(max(0.0, ctx_slope) * us, 6)},
        "cpu": _host_cpu(m, h0, h1, threads, where, host_experts),
        "source": where,
        "sources": sources,
    }
    if pg_per_byte > 0:
        hw["pageable_gbps"] = round(1 / pg_per_byte / 1e9, 4)
        sources["pageable_gbps"] = (f"{where}; least-squares fit of {len(pageable)} copy sizes from pageable "
                                    "(not pinned) host memory")
    runtime = {"name": f"calibrated-{device.type}", "layer_us": round(moe_overhead_s * us, 3),
               "iteration_us": round(iteration_s * us, 3), "token_us": round(token_s * us, 3),
               "demand_load_us": 0.0, "prefetch_issue_us": 0.0, "source": ""}
    get_hardware(dict(hw))   # validate before the simulator uses it
    demand = demand_load_cost(m, workload, runs, hw, runtime)
    runtime["demand_load_us"] = round(demand["demand_load_us"], 3)
    issue = prefetch_issue_cost(m, workload, runs, hw, runtime)
    runtime["prefetch_issue_us"] = round(issue["prefetch_issue_us"], 3)
    runtime["source"] = (
        f"{where}; layer_us: the executor's decode step with every expert resident ({step * us:.1f} us, "
        f"{runs['routing']}) minus layers, experts and head; iteration_us, token_us: the stubbed forward "
        f"minus its layers and head, against tokens; demand_load_us: the executor's step with every access a demand "
        f"load ({runs['demand_s'] * us:.1f} us) exceeds the resident one by {demand['measured_gap_us']:.1f} us, the "
        f"simulator predicts {demand['predicted_gap_us']:.1f} us from the copy and compute fits; the rest over "
        f"{demand['loads_per_step']:.0f} demand loads per step; prefetch_issue_us: the executor's step with every "
        f"expert prefetched by oracle-prefetch ({runs['prefetch_s'] * us:.1f} us) exceeds the resident one by "
        f"{issue['measured_gap_us']:.1f} us, the simulator predicts {issue['predicted_gap_us']:.1f} us without an "
        f"issue cost; " + (
            f"the simulated step hardly responds to an issue cost (the copies set it): each prefetch's share of "
            f"the excess ({issue['prefetches_per_step']:.2f} per step; bisection gave {issue['bisection_us']:.1f} us)"
            if issue.get("copy_bound") else
            f"the cost per prefetch ({issue['prefetches_per_step']:.2f} per step) that makes them equal"))
    get_runtime(dict(runtime))
    return {
        "provenance": prov,
        "model": m.model_dump(mode="json"),
        "hardware": hw,
        "runtime": runtime,
        "measurements": {
            "copies": copies, "experts": experts, "host_experts": host_experts, "roofline": roof, "layers": layer_rows, "rounds": per_round,
            "head_s": head, "stub_forward_s": stub, "executor_step_s": step, "context": context,
            "executor_runs": runs, "demand_load_fit": demand, "prefetch_issue_fit": issue,
            "layer_context_slope_us_per_token": ctx_slope * us,
        },
    }


def _sig(x: float, digits: int = 5) -> float:
    """``x`` to ``digits`` significant digits: a rate written to a profile keeps its precision
    however slow the host (0.32044 GB/s, not 0.32)."""
    return float(f"{x:.{digits}g}")


def _host_cpu(m: ModelSpec, e0: float, e1: float, threads: int, where: str,
              rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile's host CPU: the measured expert times at ``threads`` threads (they override
    the roofline: each token count's row, and the line through them) and the read bandwidth
    those threads reached at one token."""
    cores = max(threads, os.cpu_count() or threads)
    gbps = m.expert_bytes / e0 / 1e9 if e0 > 0 else 1e3
    at = f"{where}; one expert of the model on the host at {threads} torch thread(s)"
    return {
        "name": "calibrated-host", "cores": cores, "threads": threads,
        "mem_gbps": _sig(gbps), "thread_gbps": _sig(gbps / threads), "call_us": 0.0,
        "expert_us": round(e0 * 1e6, 3), "expert_us_per_token": round(e1 * 1e6, 3),
        "expert_us_by_tokens": {int(r["tokens"]): round(r["s"] * 1e6, 3) for r in rows},
        "source": at,
        "sources": {"cores": f"{where}; logical CPUs of the host", "threads": "--threads of simctl calibrate",
                    "mem_gbps": f"{at}: expert bytes over its one-token time (a lower bound for every core)",
                    "thread_gbps": f"{at}: mem_gbps over the threads",
                    "expert_us": f"{at}, one token", "expert_us_per_token": f"{at}: least-squares slope over tokens",
                    "expert_us_by_tokens": f"{at}, each token count (what the simulator uses: the host's kernel "
                                           "need not be a line in tokens)",
                    "call_us": "folded into the measured expert times"},
    }


def write_profile(profile: dict[str, Any], path: str | Path, *, force: bool = False) -> Path:
    """Write the profile YAML (a header comment says what it is), whole or not at all; an
    existing file is replaced only with ``force``."""
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise MoesimError(f"{p}: a profile file must end in .yaml or .yml (scenarios recognise it by that)")
    head = ("# moesim calibration profile (simctl calibrate). Use it in a scenario as\n"
            f"#   hardware: {p.name}\n#   runtime: {p.name}\n")
    with atomic_file(p, option="--out", force=force) as tmp:
        tmp.write_text(head + yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=110))
    return p
