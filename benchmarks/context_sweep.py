"""Published context-length sweeps of MoE models, predicted (issue 33, goal 1).

Run: ``python benchmarks/context_sweep.py [MEASUREMENTS.yaml ...]`` (about 10 s a set). Default:
every context sweep in ``measurements/``: ``llamacpp-dgx-spark-qwen3-coder-context.yaml``
(Qwen3-Coder-30B-A3B Q8_0 under llama.cpp on a DGX Spark, generation speed at depths 0 to
32768; the two shortest depths fit the runtime's per-layer overhead and the rate of the KV
reads, ``hardware.kv_read_gbps``, the three deeper ones are held out),
``llamacpp-dgx-spark-qwen3-coder-prefill-context.yaml`` (the same table's 2048-token prompt
processing after those contexts, the quadratic term: the two shortest depths fit the runtime's
per-token cost and the rate of attention's products, ``hardware.attention_tflops``) and
``tenstorrent-qwen3-30b-a3b-a100-context.yaml`` (Qwen3-30B-A3B under vLLM on one A100, time per
output token at input lengths 128 to 8192; the shortest fits the per-layer overhead). For each
set it runs ``simctl fit``, then prints per depth the measured value, moesim's prediction with
the context modelled (``workload.context_tokens``), its ratio, and the prediction without it
(``context_tokens: 0`` at the same fitted values: what moesim predicted before, the same at
every depth). The goal is every ratio within 1.25x. Output committed as
``benchmarks/results/context_sweep.md``; exit 1 when a depth of a set misses the goal.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = (ROOT / "measurements" / "llamacpp-dgx-spark-qwen3-coder-context.yaml",
            ROOT / "measurements" / "llamacpp-dgx-spark-qwen3-coder-prefill-context.yaml",
            ROOT / "measurements" / "tenstorrent-qwen3-30b-a3b-a100-context.yaml")
GOAL = 1.25


def main() -> int:
    """Fit, predict and print every set; exit 1 when a depth of one misses the goal."""
    paths = [Path(a) for a in sys.argv[1:]] or list(DEFAULTS)
    worst = [sweep(path) for path in paths]
    return 0 if max(worst) <= GOAL else 1


def sweep(path: Path) -> float:
    """Fit one set, print its depths, and return its worst ratio either way."""
    doc = yaml.safe_load(path.read_text())
    with tempfile.TemporaryDirectory(prefix="moesim-context-") as tmp:
        out = Path(tmp) / "fit"
        subprocess.run([sys.executable, "-m", "moesim.sim.cli.main", "fit", str(path), "-o", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        rows = list(csv.DictReader((out / "rows.csv").open()))
        fitted = yaml.safe_load((out / "fitted.yaml").read_text())
    values = {p["key"]: p["value"] for p in fitted["parameters"]}
    print(f"{doc['name']}: {doc['source']}")
    print("fitted: " + ", ".join(f"{k} = {v:.6g}" for k, v in values.items()))
    flat = no_context(doc, values)
    print(f"{'context':>8} {'role':>5} {'measured':>9} {'predicted':>9} {'ratio':>7} {'no-context':>10} {'ratio':>7}")
    worst = 1.0
    first = last = None
    for row in rows:
        depth = json.loads(row["set"]).get("workload.context_tokens", 0)
        measured, predicted = float(row["measured"]), float(row["predicted"])
        ratio = predicted / measured
        worst = max(worst, ratio, 1 / ratio)
        first = first or (depth, measured, predicted)
        last = (depth, measured, predicted)
        print(f"{depth:>8} {row['role']:>5} {measured:>9.3f} {predicted:>9.3f} {ratio:>6.3f}x {flat:>10.3f} "
              f"{flat / measured:>6.3f}x")
    if first and last and last[1] != first[1]:
        grew, pgrew = last[1] - first[1], last[2] - first[2]
        print(f"from context {first[0]} to {last[0]}: measured {grew:+.3f}, predicted {pgrew:+.3f} "
              f"({pgrew / grew:.0%} of the measured change)")
    print(f"worst ratio {worst:.3f}x (goal: within {GOAL}x at every depth): {'met' if worst <= GOAL else 'missed'}")
    print()
    return worst


def no_context(doc: dict, values: dict[str, float]) -> float:  # type: ignore[type-arg]
    """The set's metric without the context modelled, at the fitted values (one number: every
    depth is the same run then)."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.runner import run_loaded

    metric = next(k for k in doc["rows"][0] if k not in ("set", "role", "source", "read_off", "relative_to"))
    loaded = load_scenario_data(doc["base"], source="context_sweep", base_dir=ROOT,
                                overrides=[f"{k}={v}" for k, v in values.items()])
    value = run_loaded(loaded).metrics[metric]
    return float(value["mean"] if isinstance(value, dict) else value)


if __name__ == "__main__":
    sys.exit(main())
