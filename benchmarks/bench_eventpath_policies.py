"""Event-path speed per policy: layer-steps per CPU second of the SimPy event loop, engine only.

Mixtral-8x7B shape, batch 1, decode tokens of the generator's Mixtral preset (4 requests), each
policy forced through the event loop (``fast_replay=None``), best of ``--repeat`` runs (the
machine is shared: the best run is the least disturbed one). Prints figures; asserts nothing.

    python benchmarks/bench_eventpath_policies.py [--tokens 2000] [--hardware a100-pcie-80gb]
        [--experts-per-layer 2] [--repeat 3] [--policies mixtral-offloading,moe-infinity,fmoe]
"""

from __future__ import annotations

import argparse
import os
import time

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_hardware, get_model
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.traces.format.trace_file import trace_from_columns
from moesim.traces.synthetic.generator import SynthParams, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens (4 requests)")
    ap.add_argument("--hardware", default="a100-pcie-80gb")
    ap.add_argument("--experts-per-layer", type=float, default=2, help="2 of 8: cache rate 0.25")
    ap.add_argument("--repeat", type=int, default=3, help="runs per policy; the best is printed")
    ap.add_argument("--policies", default="mixtral-offloading,moe-infinity,fmoe,activeevict")
    args = ap.parse_args()

    params = SynthParams.from_preset("mixtral-8x7b-legacy", requests=4, prompt_len=0,
                                     decode_len=args.tokens // 4, seed=0)
    cols, meta = generate(params)
    trace = trace_from_columns(cols, meta)
    model, hw = get_model(trace.model.name), get_hardware(args.hardware)
    wl = build_workload(trace, batch_size=1, phases=["decode"])
    budget = int(args.experts_per_layer * model.num_layers) * model.expert_bytes
    print(f"{trace.num_rows} layer-steps per run, {hw.name}, {args.experts_per_layer:g} experts/layer, "
          f"best of {args.repeat}; load {os.getloadavg()[0]:.2f}")
    for name in args.policies.split(","):
        best_cpu = best_wall = float("inf")
        steps = 0
        for _ in range(args.repeat):
            engine = Engine(wl, make_policy(name), CostModel(model, hw), budget_bytes=budget,
                            fast_replay=None)
            t0, c0 = time.perf_counter(), time.process_time()
            engine.run()
            best_wall = min(best_wall, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
            steps = len(engine.state.steps)
        print(f"{name:20s} {steps / best_cpu:>9,.0f} layer-steps per CPU s  "
              f"{steps / best_wall:>9,.0f} per wall s  ({best_cpu * 1e6 / steps:.1f} us per step)")


if __name__ == "__main__":
    main()
