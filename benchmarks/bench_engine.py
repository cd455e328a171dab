"""Engine speed: simulated layer-steps per second and simulated time / wall time.

Mixtral-8x7B, batch 1, mixtral-offloading, on a synthetic trace of the generator's Mixtral
preset (decode tokens only, unless ``--prompt-len`` adds a prompt to each request: its prefill
iteration runs too). Prints figures; asserts nothing.

    python benchmarks/bench_engine.py [--tokens 2000] [--policy mixtral-offloading] [--profile]
                                      [--event-loop | --driver] [--model mixtral-8x7b] [--initial popular]
                                      [--prompt-len 256] [--buffer-experts 2]

Demand-only policies (lru, lfu, fifo, random, belady; static started warm with
``--initial popular``) and the next-layer prefetchers mixtral-offloading and oracle-prefetch
(sim/fast/prefetch.py) take a kernel of the fast path, every other policy its driver
(sim/fast/driver.py), unless ``--event-loop`` forces SimPy or ``--driver`` the driver; the line
``path:`` says which ran. A policy that declares a transfer buffer among its setup needs
(MoEpic's ``U_b = K``: ``SetupNeeds.buffer_experts``) gets it, as ``simctl study`` gives it,
unless ``--buffer-experts`` names another size: without it MoEpic's prefetch never runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import get_hardware, get_model
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.traces.format.trace_file import trace_from_columns
from moesim.traces.synthetic.generator import SynthParams, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens (4 requests)")
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="prompt tokens per request (0: decode only); prefill iterations run too")
    ap.add_argument("--policy", default="mixtral-offloading")
    ap.add_argument("--hardware", default="rtx-4090")
    ap.add_argument("--experts-per-layer", type=float, default=2)
    ap.add_argument("--profile", action="store_true", help="print the 15 most expensive functions")
    ap.add_argument("--event-loop", action="store_true", help="force the SimPy event loop (no fast path)")
    ap.add_argument("--driver", action="store_true", help="force the fast path's driver (no kernel)")
    ap.add_argument("--buffer-experts", type=float, default=None,
                    help="transfer buffer in experts (default: the policy's declared need, else 0)")
    ap.add_argument("--initial", default="empty", help="cache.initial: empty, popular or random")
    ap.add_argument("--preset", default="mixtral-8x7b-legacy", help="synthetic trace preset (the model's shape)")
    ap.add_argument("--model", default=None,
                    help="catalog model whose shape the trace takes (default: the preset's), e.g. deepseek-v3")
    args = ap.parse_args()
    if args.driver:   # the fast path without its kernels
        from moesim.sim.fast import path
        path.kernel_of = lambda state: None

    requests = 4
    params = SynthParams.from_preset(args.preset, requests=requests, prompt_len=args.prompt_len,
                                     decode_len=args.tokens // requests, seed=0,
                                     **({"model": args.model} if args.model else {}))
    t0 = time.perf_counter()
    cols, meta = generate(params)
    trace = trace_from_columns(cols, meta)
    t_gen = time.perf_counter() - t0
    model, hw = get_model(trace.model.name), get_hardware(args.hardware)
    wl = build_workload(trace, batch_size=1, phases=["prefill", "decode"] if args.prompt_len else ["decode"])
    budget = int(args.experts_per_layer * model.num_layers) * model.expert_bytes
    policy = make_policy(args.policy)
    buffer_experts = args.buffer_experts
    if buffer_experts is None:   # the policy's declared need (MoEpic: top_k), as simctl study gives it
        buffer_experts = policy.needs().buffer_size(model.top_k)
    engine = Engine(wl, policy, CostModel(model, hw), budget_bytes=budget,
                    buffer_bytes=int(round(buffer_experts * model.expert_bytes)),
                    initial=args.initial, fast_replay=None if args.event_loop else FAST_PATH)
    prof = cProfile.Profile() if args.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    engine.run()
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m = compute_metrics(engine.state)
    steps = len(engine.state.steps)
    print(f"trace: {trace.num_rows} rows ({wl.decode_tokens} decode tokens"
          + (f", {requests} prompts of {args.prompt_len}" if args.prompt_len else "") + f" x {model.num_layers} layers), "
          f"generated and validated in {t_gen:.2f} s")
    print(f"policy {args.policy} on {hw.name}, {args.experts_per_layer:g} experts/layer"
          + (f" + a {buffer_experts:g}-expert transfer buffer" if buffer_experts else "") + ": "
          f"hit {m['hit_rate']:.3f}, late {m['late_rate']:.3f}, TPOT {m['tpot_ms']['mean']:.1f} ms")
    print(f"path: {engine.state.path}" + (f" ({engine.state.path_reason})" if engine.state.path_reason else ""))
    print(f"layer-steps: {steps}  wall: {wall:.3f} s  ->  {steps / wall:,.0f} layer-steps/s")
    print(f"engine CPU time: {cpu:.3f} s  ->  {steps / cpu:,.0f} layer-steps per CPU second")
    print(f"simulated {m['sim_time_s']:.2f} s in {wall:.3f} s wall: {m['sim_time_s'] / wall:,.1f}x real time")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        print(s.getvalue())


if __name__ == "__main__":
    main()
