"""Prefetching and map-based policies ranked on realistic routing (moesim issue 22 item 5).

Run: ``python benchmarks/routing_rankings.py [--out FILE.md] [--quick]`` (a few minutes on a
shared 2-core machine; output committed as ``benchmarks/results/routing_rankings.md``).

The policies whose ranking depends on how predictable routing is (mixtral-offloading,
moe-infinity, promoe-style, fmoe, commitmoe, adapmoe, pregated, moepic) and lru as the
reference, with their default parameters, on:

* the recorded trace of the tiny MoE (``traces/samples/tiny-moe.parquet``: real router logits,
  lookahead logits, embeddings, token ids) with its experts scaled to Mixtral-8x7B's size (hidden
  4096, expert FFN 14336, bf16: 352 MB per expert; non-expert weights Mixtral's per layer), so
  that copies take as long as Mixtral's;
* the recorded trace of the fine-grained MoE (``traces/samples/fine-moe.parquet``: 64 experts,
  top-8, every column), scaled the same way;
* the recorded FLAME-MoE-290M sample (``traces/samples/flame-moe-290m.parquet``: routed experts,
  weights and token ids only, no logits), scaled the same way, where the policies that need
  logits are n/a;
* each synthetic preset fitted to published statistics (``<model>``, benchmarks/fit_presets.py)
  and the same preset before the fit (``<model>-legacy``), at one small workload.

Common setting: A100 PCIe 80 GB (catalog roofline, 25 GB/s host link), a quarter of every
layer's experts cached (per-layer pools; fmoe's one global cache holds the same total), empty
at the start, batch 1, prefill and decode replayed, the first 70% of the requests as the
``profile:`` split (fmoe's store, promoe-style's strides, moe-infinity's matrices learn from
it; the others ignore it) and the rest measured. ``moepic`` gets a transfer buffer of 2
experts (``cache.buffer_experts``) on top of the same cache; ``commitmoe`` is lossy (it runs
the predicted experts, so its hit rate counts predictions that were resident). A policy that
needs a trace column the trace lacks is reported n/a with the reason. Only simulated figures
are printed, so the machine's load does not change them (same seed, same numbers).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.run.runner import run_loaded
from moesim.traces.format.trace_file import Trace, read_trace, trace_from_columns
from moesim.traces.synthetic.generator import generate, parse_params
from moesim.traces.synthetic.preset_targets import fitted_presets

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "traces" / "samples" / "tiny-moe.parquet"
FINE = ROOT / "traces" / "samples" / "fine-moe.parquet"
FLAME = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
POLICIES = ["lru", "mixtral-offloading", "pregated", "adapmoe", "promoe-style", "moe-infinity", "fmoe",
            "commitmoe", "moepic"]
NEEDS = {  # trace columns a policy cannot run without (their fallbacks would rank something else)
    "mixtral-offloading": ["lookahead_logits"], "pregated": ["lookahead_logits"], "adapmoe": ["lookahead_logits"],
    "promoe-style": ["lookahead_logits"], "moepic": ["lookahead_logits"], "commitmoe": ["lookahead_logits"],
    "fmoe": ["logits", "embedding"],
}
MIXTRAL_NON_EXPERT_PER_LAYER = 3205686784 // 32  # catalog mixtral-8x7b non_expert_bytes / its 32 layers
MIXTRAL_EXPERT = {"hidden_size": 4096, "expert_intermediate_size": 14336, "dtype_bytes": 2}
TINY_SCALED = {"base": "tiny-moe", **MIXTRAL_EXPERT, "non_expert_bytes": 4 * MIXTRAL_NON_EXPERT_PER_LAYER}
FINE_SCALED = {"base": "fine-moe", **MIXTRAL_EXPERT, "non_expert_bytes": 8 * MIXTRAL_NON_EXPERT_PER_LAYER}
FLAME_SCALED = {"base": "flame-moe-290m", **MIXTRAL_EXPERT, "non_expert_bytes": 8 * MIXTRAL_NON_EXPERT_PER_LAYER}
WORKLOAD = {"requests": 10, "prompt_len": 32, "decode_len": 64, "seed": 0}
QUICK = {"requests": 4, "prompt_len": 8, "decode_len": 16, "seed": 0}


def traces(workload: dict[str, int]) -> list[tuple[str, Any, Any, Trace]]:
    """``(label, trace spec, model, trace)`` of every trace compared."""
    out: list[tuple[str, Any, Any, Trace]] = [
        ("tiny-moe (recorded)", str(TINY), TINY_SCALED, read_trace(TINY)),
        ("fine-moe (recorded)", str(FINE), FINE_SCALED, read_trace(FINE)),
        ("flame-moe-290m (recorded)", str(FLAME), FLAME_SCALED, read_trace(FLAME)),
    ]
    for preset in fitted_presets():
        for name in (preset, f"{preset}-legacy"):
            spec = {"synthetic": {"preset": name, **workload}}
            cols, meta = generate(parse_params(spec["synthetic"]))
            out.append((name, spec, preset, trace_from_columns(cols, meta)))
    return out


def scenario(trace: Any, model: Any, requests: int, policy: str) -> dict[str, Any]:
    """The scenario of one run (module docstring)."""
    cache: dict[str, Any] = {"rate": 0.25, "initial": "empty"}
    if policy == "moepic":
        cache["buffer_experts"] = 2
    return {"name": f"routing-rankings-{policy}", "trace": trace, "model": model, "hardware": "a100-pcie-80gb",
            "cache": cache, "policy": policy, "profile": {"requests": max(1, round(0.7 * requests))},
            "workload": {"batch_size": 1, "phases": ["prefill", "decode"]}, "seed": 0}


def run_trace(label: str, spec: Any, model: Any, trace: Trace) -> list[dict[str, Any]]:
    """Every policy on one trace: hit rate, TPOT and the rank by TPOT (n/a rows carry why)."""
    rows: list[dict[str, Any]] = []
    requests = len(np.unique(trace.request_id))
    for policy in POLICIES:
        missing = [c for c in NEEDS.get(policy, []) if getattr(trace, c, None) is None]
        if missing:
            rows.append({"policy": policy, "na": f"no {', '.join(missing)}"})
            continue
        loaded = load_scenario_data(scenario(spec, model, requests, policy), source=label, base_dir=ROOT)
        m = run_loaded(loaded, trace=trace, steps=False).metrics
        rows.append({"policy": policy, "hit": float(m["hit_rate"]), "partial": float(m["partial_rate"]),
                     "tpot": float(m["tpot_ms"]["mean"])})
    ranked = sorted((r for r in rows if "na" not in r), key=lambda r: r["tpot"])
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    return rows


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Markdown: one row per policy, hit rate / TPOT ms (rank by TPOT) per trace."""
    labels = list(results)
    lines = ["| policy | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    for policy in POLICIES:
        cells = []
        for lab in labels:
            r = next(x for x in results[lab] if x["policy"] == policy)
            part = f" (+{r['partial']:.3f} partial)" if r.get("partial") else ""
            cells.append(f"n/a: {r['na']}" if "na" in r else f"{r['hit']:.3f}{part} / {r['tpot']:.1f} ({r['rank']})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def orderings(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Pairwise conclusions that issue 22 asks about, per trace: who has the higher hit rate
    and the lower TPOT of fmoe against mixtral-offloading and of each prefetcher against lru."""
    pairs = [("fmoe", "mixtral-offloading"), ("fmoe", "promoe-style"), ("fmoe", "moe-infinity"),
             ("moe-infinity", "mixtral-offloading"), ("promoe-style", "mixtral-offloading"),
             ("moepic", "mixtral-offloading"), ("pregated", "mixtral-offloading"), ("adapmoe", "mixtral-offloading")]
    lines = ["| trace | " + " | ".join(f"{a} vs {b}" for a, b in pairs) + " |", "| --- |" + " --- |" * len(pairs)]
    for lab, rows in results.items():
        by = {r["policy"]: r for r in rows if "na" not in r}
        cells = []
        for a, b in pairs:
            if a not in by or b not in by:
                cells.append("n/a")
                continue
            dh = by[a]["hit"] - by[b]["hit"]
            dt = by[a]["tpot"] / by[b]["tpot"]
            cells.append(f"hit {dh:+.3f}, TPOT x{dt:.2f}")
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    """Run every policy on every trace and print (with ``--out`` also write) the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the report to this markdown file")
    ap.add_argument("--quick", action="store_true", help="a tiny synthetic workload (a smoke run, not for reading)")
    args = ap.parse_args()
    workload = QUICK if args.quick else WORKLOAD
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    for label, spec, model, trace in traces(workload):
        t1 = time.perf_counter()
        results[label] = run_trace(label, spec, model, trace)
        print(f"{label}: {time.perf_counter() - t1:.1f} s", flush=True)
    wall = time.perf_counter() - t0
    lines = ["# Policy rankings on recorded and fitted routing", "",
             "Output of `python benchmarks/routing_rankings.py` (issue 22 item 5; the set-up is in the script's "
             f"docstring). Synthetic traces: {workload['requests']} requests of {workload['prompt_len']} prompt + "
             f"{workload['decode_len']} decode tokens, seed {workload['seed']}, the first "
             f"{max(1, round(0.7 * workload['requests']))} profiled; the recorded traces: the first 70% of their "
             "requests profiled (tiny-moe 8 of 12). Cells: hit rate / mean TPOT in ms (rank by TPOT among the policies that ran). "
             f"Whole run {wall:.0f} s.", ""]
    lines += table(results)
    lines += ["", "Pairwise (first against second: hit-rate difference, TPOT ratio; below 1 means the first is "
              "faster):", ""]
    lines += orderings(results)
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        from results_file import write_result  # this folder is on sys.path when run as a script

        write_result(args.out, text + "\n")


if __name__ == "__main__":
    main()
