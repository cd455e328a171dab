"""Speed of a serving run (issue 33, goal 2): 1,000 requests of Mixtral-8x7B arriving as a
Poisson process and continuously batched (``scenarios/serving/mixtral-continuous.yaml``),
replayed by the fast path's driver (the event loop's GPU stream without SimPy). Prints the layer-steps (iterations x MoE layers) per CPU second of
the replay, and of the whole run (trace synthesis, workload, replay, metrics).

    python benchmarks/serving_speed.py [--requests 1000] [--set KEY=VALUE ...]

CPU time is the process's (``time.process_time``): steadier than wall time on a shared machine.
The issue's goal is >= 20,000 layer-steps per CPU second.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "serving" / "mixtral-continuous.yaml"
GOAL = 20_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests that arrive")
    ap.add_argument("--set", action="append", default=[], help="override a key of the scenario (repeatable)")
    args = ap.parse_args()
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.run.metrics import compute_metrics
    from moesim.sim.run.runner import prepare_run

    c0 = time.process_time()
    loaded = load_scenario(SCENARIO, [f"workload.arrivals.requests={args.requests}", *args.set])
    prep = prepare_run(loaded, steps=False)
    c1 = time.process_time()
    w1 = time.perf_counter()
    prep.engine.run()
    c2 = time.process_time()
    w2 = time.perf_counter()
    metrics = compute_metrics(prep.engine.state)
    c3 = time.process_time()
    L = prep.engine.state.L
    steps = metrics["iterations"] * L
    replay = steps / (c2 - c1)
    whole = steps / (c3 - c0)
    print(f"scenario: {SCENARIO.relative_to(ROOT)} ({args.requests} requests, {metrics['iterations']} iterations "
          f"x {L} layers = {steps} layer-steps; engine {metrics['engine_path']})")
    print(f"replay: {replay:,.0f} layer-steps per CPU second ({c2 - c1:.2f} CPU s, {w2 - w1:.2f} wall s)")
    print(f"whole run: {whole:,.0f} layer-steps per CPU second ({c3 - c0:.2f} CPU s)")
    print(f"goal >= {GOAL:,}: {'met' if replay >= GOAL else f'short by {GOAL / replay:.2f}x'} "
          f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
