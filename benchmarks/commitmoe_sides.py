"""Which side of each CommitMoE Fig. 5 row misses (issue 32): the vLLM v0.7.0 baseline against
the least it can copy, or CommitMoE against the per-layer time its runtime would need.

    python benchmarks/commitmoe_sides.py --out benchmarks/results/commitmoe_sides.md   # ~3 min on 2 cores

Every row of measurements/commitmoe-fig5.yaml is a ratio: CommitMoE's end-to-end tokens/s over
vLLM's (policy vllm-offload, runtime vllm-like) on the same setup. A ratio predicted too high
is either a baseline too slow or a CommitMoE too fast. For each row this prints:

- vLLM's decode TPOT as simulated, and the least it could be: vLLM v0.7.0's ``--cpu-offload-gb``
  copies every offloaded parameter from pinned memory before each forward pass
  (``maybe_offload_to_cpu``, vllm/model_executor/models/utils.py: ``v.to(device,
  non_blocking=True)`` over the layer's whole state dict, then ``functional_call``; nothing
  cached, no prefetch), so each pass copies at least the bf16 model's bytes beyond what the GPU
  holds: the catalog model's bytes less :data:`GPU_SHARE` of the GPU's memory (vLLM's default
  ``gpu_memory_utilization``, with nothing kept for the KV cache or activations), over the
  link's theoretical rate (``pcie_gen`` x16). A TPOT the row asks below that floor cannot be the
  baseline's.
- the vLLM TPOT the row asks: the simulated reference's, scaled by measured / predicted (the
  ratio is linear in the reference's tokens/s).
- CommitMoE's decode TPOT as simulated, and the per-layer time (``runtime.layer_us``) of its
  runtime (MoE-Infinity's, fitted by measurements/moe-infinity-readme.yaml) at which the row's
  ratio is the paper's, solved with the reference fixed ("none": no per-layer time from 0 to
  200 ms reaches it), and CommitMoE's TPOT at that time.

A diagnostic that reads held-out rows: nothing here may be adopted into a fit, and no file is
changed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEM = "commitmoe-fig5"
"""The measurement set."""

RUNTIME_FIT = ROOT / "benchmarks" / "results" / "fits" / "moe-infinity-readme" / "fitted.yaml"
"""The fit whose runtime section CommitMoE's rows read (the set's base ``runtime``)."""

GPU_SHARE = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of the GPU's memory it may use."""

GIB = 1024 ** 3


def _tpot(m: dict[str, Any]) -> float:
    value = m["tpot_ms"]
    return float(value["mean"] if isinstance(value, dict) else value)


def _runtime(layer_us: float) -> dict[str, Any]:
    """The fitted runtime section with another per-layer time (the set names the fit's file, so
    the override replaces the whole section)."""
    rt = dict(yaml.safe_load(RUNTIME_FIT.read_text())["runtime"])
    base = rt.pop("name")
    return {"base": base, **{k: v for k, v in rt.items() if v is not None}, "layer_us": layer_us}


def vllm_floor_ms(data: dict[str, Any]) -> tuple[float, float]:
    """(GB vLLM must copy per pass at least, ms that takes at the link's theoretical rate)."""
    from moesim.sim.config.catalog import get_hardware, get_model

    model, hw = get_model(data["model"]), get_hardware(data["hardware"])
    total = model.routed_bytes + model.non_expert_bytes
    offload = max(0.0, total - GPU_SHARE * hw.vram_gib * GIB)
    link = hw.link_gbps or hw.pcie_gbps
    return offload / 1e9, offload / (link * 1e9) * 1e3


def row_line(ms: Any, job: Any) -> str:
    """One Markdown row (see the module)."""
    from scipy.optimize import brentq

    from moesim.sim.study.fit_runs import _metrics

    measured = ms.rows[job.index].measured["tokens_per_s"]
    ref = _metrics(job.reference, job.source, job.base_dir, job.reference_fixed, ())
    own = _metrics(job.data, job.source, job.base_dir, job.fixed, ())
    predicted = own["tokens_per_s"] / ref["tokens_per_s"]
    fitted_us = float(yaml.safe_load(RUNTIME_FIT.read_text())["runtime"]["layer_us"])

    def run(layer_us: float) -> dict[str, Any]:
        return _metrics(job.data, job.source, job.base_dir, job.fixed, (("runtime", _runtime(layer_us)),))

    def ratio(layer_us: float) -> float:
        return float(run(layer_us)["tokens_per_s"] / ref["tokens_per_s"])

    lo, hi = (fitted_us, 200_000.0) if predicted > measured else (0.0, fitted_us)
    if (ratio(lo) - measured) * (ratio(hi) - measured) > 0:
        asked, then = "none", "-"   # the ratio does not reach the paper's between 0 and 200 ms per layer
    else:
        layer_us = brentq(lambda u: ratio(u) - measured, lo, hi, xtol=20.0)
        asked, then = f"{layer_us:.0f}", f"{_tpot(run(layer_us)):.0f}"
    gb, floor = vllm_floor_ms(job.data)
    return (f"| {job.index} | {job.data['model']} / {job.data['hardware']} | {measured:g} | {predicted:.2f} | "
            f"{_tpot(ref):.0f} | {gb:.1f} GB, {floor:.0f} | {_tpot(ref) * measured / predicted:.0f} | "
            f"{_tpot(own):.0f} | {fitted_us:.0f} | {asked} | {then} |")


def report() -> list[str]:
    """The Markdown report (see the module)."""
    from moesim.sim.study.fit_runs import row_jobs
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(ROOT / "measurements" / f"{STEM}.yaml")
    out = ["# CommitMoE Fig. 5: which side of each row misses", "",
           "Written by `python benchmarks/commitmoe_sides.py` (see its docstring). TPOT in ms (decode, batch 1);",
           "a diagnostic that reads held-out rows, not a fit.", "",
           "| row | model / GPU | measured | predicted | vLLM TPOT | vLLM least copy per pass, ms at the link's "
           "theoretical rate | vLLM TPOT the row asks | CommitMoE TPOT | CommitMoE layer_us (fitted) | "
           "CommitMoE layer_us the row asks | CommitMoE TPOT then |",
           "| --- " * 11 + "|"]
    out += [row_line(ms, job) for job in row_jobs(ms)]
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the report, and write it with ``--out``."""
    from results_file import report_main  # this folder is on sys.path when run as a script

    return report_main(lambda: "\n".join(report()) + "\n", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
