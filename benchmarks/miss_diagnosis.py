"""Why each held-out row beyond 1.5x misses (issue 32 item 2): every such row of the committed
fits, the cost it asks for, the evidence, and whether a cost field of the catalogs (the
CPU-side ones of this issue included: ``runtime.cpu_switch_us``, ``launch_us x layer_kernels``
unless ``cuda_graphs``) closes it.

    python benchmarks/miss_diagnosis.py --out benchmarks/results/miss_diagnosis.md   # ~30 s

The rows are read from ``benchmarks/results/fits/<set>/fitted.yaml`` (held-out rows, |log ratio|
beyond log 1.5 or no prediction), the sets that re-fit another set's rows left out as the
scoreboard leaves them out. Each diagnosis (:data:`DIAGNOSES`) is keyed by set and by the
policy the row runs; it states the cost asked for and the evidence from the committed outputs
(the scoreboard's measured reasons, ``cost_ablations.md``); a row without one is printed as
undiagnosed, so that a new miss cannot pass unnoticed. One check is run here, not read: the
launch-bound eager runtime against a graph-captured one on CommitMoE's rows (CommitMoE runs on
PyTorch and MoE-Infinity, vLLM v0.7.0 captures CUDA graphs), :func:`commitmoe_runtimes`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FITS = ROOT / "benchmarks" / "results" / "fits"

DIAGNOSES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("activeevict-table3-llama", "activeevict"): (
        "none of the runtime's costs: the policy's traffic on this routing",
        "ActiveEvict's own I/O is predicted 1.6-1.9x above the paper's; in the rerun its hit rate is 0.394 "
        "against LRU's 0.518 (the paper has it moving less than LRU): pre-eviction and the budget-aware "
        "dynamic top-k lose hits on the synthetic LLaMA-MoE routing at the fitted 5.03 experts per layer. A "
        "per-layer or per-copy time changes no byte count (h2d_gb_per_token, io_busy: copies only)",
        "no"),
    ("commitmoe-fig5", "commitmoe"): (
        "CommitMoE's own time on the paper's hosts (about 2x), not the baseline's copies",
        "in the scoreboard's rerun of row 0 vllm-offload copies 25.2 GB a token (whole offloaded layers every "
        "pass) against CommitMoE's 7.3: the speed-up is mostly the ratio of copy volumes. But vLLM v0.7.0 cannot copy "
        "less (commitmoe_sides.md: each pass copies at least the bf16 model beyond 0.9 of the GPU): row 0 asks a vLLM "
        "of 1534 ms a token, below its 2229 ms copy floor at PCIe 4.0's theoretical rate; row 2 asks 261 ms, exactly "
        "its floor with no KV cache. On CommitMoE's side the rows ask 36.2 (row 0) and 8.7 ms (row 2) per layer of "
        "its MoE-Infinity runtime against the fitted 4.6 (rows 1, 3, 4: 5.9-8.2; row 5: none): no one runtime cost "
        "closes the Mixtral pair. The eager/graph launch cost, run here (table below), lowers the ratios by at most "
        "15% (row 2: 7.25x to 6.22x off)",
        "no (checked: launch cost below; commitmoe_sides.md)"),
    ("eliseev-mazur-2023-table2", "accelerate"): (
        "the naive runs' device_map (not stated in the paper), not a copy cost",
        "cost_ablations.md, 'the naive rows' two expert widths' (measured numbers and catalog bytes only): on "
        "one GPU the step grows from 2- to 3-bit experts by 84 ms (A100), 150 ms (3080 Mobile) and 211 ms (T4); "
        "under the sets' placements (accelerate's rule by bytes keeps fewer layers at 3 bits; 15 on the A100) "
        "that growth streams 2.2-4.7 GB more, 22-26 GB/s, beyond every published pageable rate (at most 10 "
        "GB/s) and, on the T4, its PCIe 3.0 link. With the same layers resident at both widths the pairs ask "
        "for 6.6 (A100), 8.8 (3080) and 10.3 (T4) streamed layers of 32 at the catalog's pageable rates: about "
        "the 2-bit placements of accelerate's rule on the 16 GB GPUs (24, 23 resident), and on the A100 a cap "
        "like theirs. accelerate's copies are pageable and blocking as modelled (set_module_tensor_to_device: "
        "value.to(device) from the CPU state dict, then torch.cuda.empty_cache() per tensor in the versions of "
        "late 2023): a per-copy host cost only slows these rows further; the pageable rate at the pinned one "
        "over-predicts the 3080 and T4 2-bit rows (1.6x). The placement is a held-out row's reading, so no "
        "set adopts it",
        "no"),
    ("fiddler-repo-baselines", "lru"): (
        "the run's setup (how many experts Mixtral-Offloading kept on the GPU): settled by physics",
        "the set's notes: the same decode file's batch-16 line (not a row) is 4.614 s a step; with 1 expert a "
        "layer on the GPU its swaps would move 155 GB a step, 33.7 GB/s, beyond the RTX 6000 Ada's PCIe 4.0 "
        "x16 (31.5 GB/s); with 3 a layer, 23.9 GB/s. The rows now take 3 (as the A6000 rows)",
        "yes (the setup, not a cost)"),
    ("fmoe-end-to-end", "fmoe"): (
        "none of the runtime's costs: fMoE's expert-map hits on synthetic routing",
        "with the authors' code's trajectory span (every later layer of a match, trajectory_span: rest) fMoE's "
        "prefetches cover 0.79 of Mixtral's routed experts (0.64 Qwen, 0.70 Phi) against Mixtral-Offloading's "
        "lookahead 0.83, and it stalls 228 ms a Mixtral token where the paper's section 6.7 bounds its "
        "synchronous part under 30 ms; with perfect maps the same mechanism and runtime give TPOT ratios "
        "0.42/0.44/0.67/0.42 (published 0.30/0.39/0.45/0.52): what the maps find on the synthetic routing, "
        "not a time (benchmarks/results/fmoe_fit.md)",
        "no"),
    ("imp-qwen3-30b-budget", "lru"): (
        "imp's eager offload path (per layer) and its pageable copies, not a per-miss cost",
        "the cache rows' steps are about 14.5 ms + 0.33 ms per expert missed: a cost that stays when the "
        "misses go, which a per-copy latency (the earlier fit's 272 us) cannot give. imp's docs/PERF.md "
        "('MoE host offload'): CUDA graphs are blocked under offload (routing read on the host), 'the path is "
        "host-bound, launch count is the currency', and host experts are not page-locked by default (WSL2 "
        "mmap; driver-staged copies): runtime imp-offload (host_memory pageable, layer_us fitted)",
        "yes (runtime imp-offload: host_memory, layer_us)"),
    ("llamacpp-epyc9374f-deepseek-v32", ""): (   # the base's policy, cpu-moe (the row names none)
        "the host's pageable copy rate for llama.cpp's op-offload copies (pp512, op offload on)",
        "the predicted 512-token pass is op offload's copies as llama.cpp makes them: only the experts the "
        "ubatch uses (PR #15346; 464.6 GB on this row's synthetic routing) from the mmap-backed CPU buffer, "
        "pageable memory (llama-model-loader's 'avoid using a host buffer when using mmap'; issue #25859's "
        "Nsight profile), at the catalog's 7.5 GB/s pageable cap: 62093 ms, 2.69x. The published 23094 ms "
        "less the ~146 ms of everything else puts those copies at 20.2 GB/s on this PCIe 5.0, 12 x DDR5-4800 "
        "host, 2.7 times the cap (set from one virtual machine's host). Ablation (cost_ablations.md): the "
        "whole layer pinned (the earlier model) 0.61x, used experts pinned 0.41x, whole layer pageable 4.02x. "
        "No published pageable rate for this host: the cap stays",
        "no"),
    ("moepic-mixtral", "moepic"): (
        "a prefill cost per token (row 11, TTFT): no fit row measures prefill",
        "every Table 3 TTFT row is predicted fast (0.66-0.77x) while its TPOT rows are 0.76-1.12x: the prefill "
        "of HQQ Mixtral costs more than the per-layer time and the roofline of 64 prompt tokens give "
        "(moepic_floor.md, section 6: measured TTFTs lie 209-353 ms above the 511 ms copy floor, the predicted "
        "33-58 ms, at 64 or 768 prompt tokens; the Mixtral-offloading code's HQQ kernels, BLOCK_SIZE_M 16, re-read "
        "an expert's weights per 16 tokens; MMLU's prompt length is not stated, 64 assumed). The fit rows are "
        "decode TPOT only (Fig. 7(b)'s Mixtral TTFT bars carry no numbers), so runtime.layer_us_per_token cannot "
        "be fitted here. Row 4 (TPOT) is 1.36x since the copy-back of the Mixtral-offloading and AdapMoE rows "
        "(cache.swap_out, their src/expert_cache.py) brought the per-layer time from 3290 to 2589 us; what is "
        "left of it: benchmarks/results/moepic_floor.md (a runtime per-miss cost does not close it)",
        "no"),
}
"""(set, policy) -> (the cost asked for, the evidence, whether a field of this branch closes it)."""

RUNTIME_PAIRS = {"none / none (as committed)": (None, None), "hf-eager / vllm-like": ("hf-eager", "vllm-like"),
                 "hf-eager / hf-eager": ("hf-eager", "hf-eager")}
"""CommitMoE's runtime / vLLM's runtime for :func:`commitmoe_runtimes`."""


def _policy(row_set: dict[str, Any]) -> str:
    pol = row_set.get("policy", "")
    return str(pol.get("name", "")) if isinstance(pol, dict) else str(pol)


def misses() -> list[dict[str, Any]]:
    """The held-out rows beyond 1.5x (or without a prediction) of every counted set."""
    from seed_scoreboard import VARIANTS  # this folder is on sys.path when run as a script

    out = []
    for folder in sorted(FITS.iterdir()):
        if folder.name in VARIANTS or not (folder / "fitted.yaml").exists():
            continue
        doc = yaml.safe_load((folder / "fitted.yaml").read_text())
        for row in doc["rows"]:
            ratio = row.get("ratio")
            if row["role"] != "test":
                continue
            if ratio is None or not math.isfinite(ratio) or abs(math.log(ratio)) > math.log(1.5):
                out.append({**row, "row_set": row.get("set") or {}, "set": folder.name})
    return out


def commitmoe_runtimes() -> list[str]:
    """The Markdown table: CommitMoE's speed-ups over vLLM predicted / published with the runtime
    pairs of :data:`RUNTIME_PAIRS` (own runtime on the row, baseline's on its reference)."""
    from moesim.sim.study.fit_runs import row_jobs, run_job
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(ROOT / "measurements" / "commitmoe-fig5.yaml")
    lines = ["| row | published | " + " | ".join(RUNTIME_PAIRS) + " |", "| --- " * (2 + len(RUNTIME_PAIRS)) + "|"]
    for row, job in zip(ms.rows, row_jobs(ms), strict=True):
        metric, measured = next(iter(row.measured.items()))
        cells = []
        for own, base in RUNTIME_PAIRS.values():
            j = job
            if own is not None and job.reference is not None:
                j = dataclasses.replace(job, data={**job.data, "runtime": own},
                                        reference={**job.reference, "runtime": base})
            pred = run_job(j, ()).values.get(metric)
            cells.append("-" if pred is None else f"{pred / measured:.2f}x")
        lines.append(f"| {row.index} | {measured:g}x | " + " | ".join(cells) + " |")
    return lines


def report() -> str:
    """The whole Markdown report."""
    rows = misses()
    text = ["# Held-out rows beyond 1.5x: the cost each asks for", "",
            "Written by `python benchmarks/miss_diagnosis.py` (see its docstring) from the committed fits.",
            f"{len(rows)} held-out rows beyond 1.5x (or without a prediction).", "",
            "| set | row | policy | metric | measured | predicted | off | cost asked for | closed by a field here |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    undiagnosed = []
    seen: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        pol = _policy(r["row_set"])
        key = (r["set"], pol)
        diag = DIAGNOSES.get(key)
        pred = r.get("predicted")
        ratio = r.get("ratio")
        off = "undefined" if ratio is None or not math.isfinite(ratio) else f"{max(ratio, 1 / ratio):.2f}x"
        pred_txt = "-" if pred is None or not math.isfinite(pred) else f"{pred:.4g}"
        if diag is None:
            undiagnosed.append(f"{r['set']} row {r['row']}")
        else:
            seen.setdefault(key, []).append(r["row"])
        text.append(f"| {r['set']} | {r['row']} | {pol} | {r['metric']} | {r['measured']:g} | {pred_txt} | {off} | "
                    f"{diag[0] if diag else 'UNDIAGNOSED'} | {diag[2] if diag else '-'} |")
    text += ["", "## Evidence", ""]
    for key, idx in seen.items():
        text.append(f"- **{key[0]}**, {key[1]} (rows {', '.join(map(str, idx))}): {DIAGNOSES[key][1]}.")
    if undiagnosed:
        text += ["", "Undiagnosed: " + ", ".join(undiagnosed) + "."]
    text += ["", "## CommitMoE: launch-bound eager runtime against a graph-captured baseline (run here)", "",
             "Predicted / published speed-up of CommitMoE over vLLM, with CommitMoE's runtime / vLLM's runtime:",
             "", *commitmoe_runtimes(), "",
             "## The CPU-expert sets (none beyond 1.5x)", "",
             *ktransformers_split(),
             "llama.cpp (`llmfit-rtx2080-llamacpp-moe`): the derived 52 us hand-off takes Qwen3-30B-A3B",
             "from 1.09x to 1.02x and DeepSeek-Coder-V2-Lite from 1.46x to 1.39x (`cost_ablations.md`).", ""]
    return "\n".join(text)


KT_SET = "ktransformers-deepseek-v3"
"""The kTransformers set, whose rows split each step into a part two sockets halve and a part they do not."""


def _socket_split(one_ms: float, two_ms: float) -> tuple[float, float]:
    """(C, F): a step of ``one_ms`` on one socket and ``two_ms`` on two, as F + C and F + C / 2."""
    c = 2.0 * (one_ms - two_ms)
    return c, one_ms - c


def ktransformers_split() -> list[str]:
    """Lines on the kTransformers set, its numbers read from its committed fit: each step (decode
    rows 0 and 2, prefill rows 1 and 3) split into the part a second socket halves (C) and the
    rest (F), measured and predicted; F short in the model is a cost that no socket count moves."""
    doc = yaml.safe_load((FITS / KT_SET / "fitted.yaml").read_text())
    rows = {r["row"]: r for r in doc["rows"]}
    values = {p["key"]: float(p["value"]) for p in doc["parameters"]}

    def step(r: dict[str, Any], which: str) -> float:
        v = float(r[which])
        return 1000.0 / v if r["metric"] == "tokens_per_s" else v

    from moesim.sim.config.catalog import get_model

    m = get_model("deepseek-v3-q4km")
    token_gb = m.expert_bytes * m.top_k * m.num_layers / 1e9   # the routed experts one decode token reads
    decode_c = _socket_split(step(rows[0], "measured"), step(rows[2], "measured"))[0]
    out = []
    for label, one, two, unit in (("decode step", 0, 2, "ms"), ("500-token prefill", 1, 3, "ms")):
        mc, mf = _socket_split(step(rows[one], "measured"), step(rows[two], "measured"))
        pc, pf = _socket_split(step(rows[one], "predicted"), step(rows[two], "predicted"))
        out.append(f"- {label}: measured C = {mc:.1f} {unit}, F = {mf:.1f} {unit}; predicted at the fit C = "
                   f"{pc:.1f} {unit}, F = {pf:.1f} {unit} (two sockets {rows[two]['ratio']:.2f}x of the measured "
                   f"{rows[two]['metric']}): F measured minus predicted {mf - pf:+.1f} {unit}.")
    h = doc["fit"]["held_out"]
    switch = values["runtime.cpu_switch_us"]
    return [f"kTransformers (`{KT_SET}`) reads its experts at the host's sourced 242.4 GB/s a socket and 26 us",
            "a call (CPUInfer's own per-layer times on this CPU, kTransformers' `doc/en/operators/llamafile.md`;",
            "`sim/config/catalog/hosts.yaml`) and fits two values on its single-socket rows: the decode's time",
            f"outside the kernel, `runtime.cpu_switch_us` {switch:.0f} us a layer (bounded below by the derived",
            f"52 us hand-off: {switch - 52:.0f} us of it has no source), and the prefill's `hardware.cpu.tflops`",
            f"{values['hardware.cpu.tflops']:.2f} (of its cores' 27.85 int8 VNNI peak). Held out: {h['rows']} rows,",
            f"median |error| {h['median_abs_error_pct']:.1f}%, max {h['max_ratio']:.2f}x. Each step of the",
            "published rows is F + C on one socket and F + C / 2 on two (C: what the sockets share out, the",
            "expert reads at decode, the expert products at prefill):", "",
            *out, "",
            f"At decode the published split gives {token_gb:.1f} GB of experts a token in C = {decode_c:.1f} ms,",
            f"{token_gb / decode_c * 1000:.0f} GB/s a socket. The fitted hand-off stands for the step's part that",
            "a second socket does not shorten (kTransformers V0.2's CPU/GPU coordination beyond two copies, or a",
            "serial part of the CPU backend); no published figure names it. Prefill's F now holds the GPU side's",
            "prefill as kTransformers V0.2.0's code runs it: its eager MLA scoring the whole static cache",
            "(`runtime.eager_score_bytes`, `static_cache_pad_tokens`) and the unpinned copies of the prompt's",
            "hidden states (`runtime.activation_copies`), 238 + 111 ms a 500-token prompt",
            "(`benchmarks/results/ktransformers_split.md`); the rest of the prefill's F has no sourced cost.", ""]


def main() -> None:
    """Print (and with --out write) the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args()
    out = report()
    sys.stdout.write(out)
    if args.out:
        from results_file import write_result  # this folder is on sys.path when run as a script

        write_result(args.out, out)


if __name__ == "__main__":
    main()
