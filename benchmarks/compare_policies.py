"""Run one scenario under several policies and print them side by side.

    python benchmarks/compare_policies.py scenarios/mixtral-4090-lru.yaml [--policies lru,lfu,...] [--set k=v ...]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from moesim.sim.config.scenario import load_scenario
from moesim.sim.run.runner import load_trace, run_loaded

BASELINES = ["no-cache", "random", "fifo", "lru", "lfu", "static", "mixtral-offloading",
             "belady", "oracle-prefetch"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--policies", default=",".join(BASELINES))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="scenario override, repeatable")
    args = ap.parse_args()
    base = load_scenario(args.scenario, args.sets)
    trace = load_trace(base)
    t = Table(title=f"{base.scenario.name} ({', '.join(args.sets) or 'as written'})")
    for col in ("policy", "hit", "late", "miss", "TTFT ms", "TPOT ms", "tokens/s", "stall ms/tok",
                "H2D MB/tok", "prefetch prec.", "recall"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name in args.policies.split(","):
        m = run_loaded(load_scenario(args.scenario, [*args.sets, f"policy={name}"]), trace=trace).metrics
        prec = "-" if m["fetch_precision"] is None else f"{m['fetch_precision']:.2f}"
        rec = "-" if m["prefetch_recall"] is None or m["fetch_precision"] is None else f"{m['prefetch_recall']:.2f}"
        t.add_row(name + (" (bound)" if m["bound"] else ""), f"{m['hit_rate']:.3f}", f"{m['late_rate']:.3f}",
                  f"{m['miss_rate']:.3f}", f"{m['ttft_ms']['mean']:.1f}", f"{m['tpot_ms']['mean']:.1f}",
                  f"{m['tokens_per_s']:.2f}", f"{m['stall_ms_per_token']:.1f}",
                  f"{m['h2d_gb_per_token'] * 1e3:.0f}", prec, rec)
    Console(width=200).print(t)


if __name__ == "__main__":
    main()
