"""A published context-length sweep of an MoE model, predicted (issue 33, goal 1).

Run: ``python benchmarks/context_sweep.py [MEASUREMENTS.yaml]`` (a few seconds; default
``measurements/tenstorrent-qwen3-30b-a3b-a100-context.yaml``: Qwen3-30B-A3B under vLLM on one
A100, time per output token at input lengths 128 to 8192). It runs ``simctl fit`` on the set
(the shortest context calibrates the runtime's per-layer overhead, every longer one is held
out), then prints per depth the measured value, moesim's prediction with the context modelled
(``workload.context_tokens``), its ratio, and the prediction without it (``context_tokens: 0``
at the same fitted values: what moesim predicted before, the same at every depth). The goal is
every ratio within 1.25x. Output committed as ``benchmarks/results/context_sweep.md``.
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
DEFAULT = ROOT / "measurements" / "tenstorrent-qwen3-30b-a3b-a100-context.yaml"
GOAL = 1.25


def main() -> int:
    """Fit, predict, print; exit 1 when a depth misses the goal."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
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
        print(f"from context {first[0]} to {last[0]}: measured +{grew:.3f}, predicted +{pgrew:.3f} "
              f"({pgrew / grew:.0%} of the measured growth)")
    print(f"worst ratio {worst:.3f}x (goal: within {GOAL}x at every depth): {'met' if worst <= GOAL else 'missed'}")
    return 0 if worst <= GOAL else 1


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
