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
from dataclasses import dataclass

from moesim.policies.contract.registry import make_policy
from moesim.sim.config.catalog import HardwareSpec, ModelSpec, get_hardware, get_model
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import Workload, build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.traces.format.trace_file import Trace, trace_from_columns
from moesim.traces.synthetic.generator import SynthParams, generate

REQUESTS = 4
"""Requests in the benchmark trace (the decode tokens are spread over them)."""


@dataclass
class BenchRun:
    """One benchmark run, built and not yet run: its engine and what it was built from."""

    engine: Engine
    trace: Trace
    workload: Workload
    model: ModelSpec
    hardware: HardwareSpec
    buffer_experts: float
    t_gen: float   # seconds to generate and validate the trace


def build_run(policy: str, tokens: int, *, prompt_len: int = 0, hardware: str = "rtx-4090",
              experts_per_layer: float = 2, initial: str = "empty", preset: str = "mixtral-8x7b-legacy",
              model: str | None = None, buffer_experts: float | None = None,
              event_loop: bool = False) -> BenchRun:
    """The engine of this benchmark's case for ``policy`` (``tokens`` decode tokens over
    :data:`REQUESTS` requests, batch 1); the transfer buffer is the policy's declared need
    unless ``buffer_experts`` names one. Other benchmarks (``policy_share.py``) build theirs here."""
    params = SynthParams.from_preset(preset, requests=REQUESTS, prompt_len=prompt_len,
                                     decode_len=tokens // REQUESTS, seed=0, **({"model": model} if model else {}))
    t0 = time.perf_counter()
    cols, meta = generate(params)
    trace = trace_from_columns(cols, meta)
    t_gen = time.perf_counter() - t0
    spec, hw = get_model(trace.model.name), get_hardware(hardware)
    wl = build_workload(trace, batch_size=1, phases=["prefill", "decode"] if prompt_len else ["decode"])
    budget = int(experts_per_layer * spec.num_layers) * spec.expert_bytes
    pol = make_policy(policy)
    if buffer_experts is None:   # the policy's declared need (MoEpic: top_k), as simctl study gives it
        buffer_experts = pol.needs().buffer_size(spec.top_k)
    engine = Engine(wl, pol, CostModel(spec, hw), budget_bytes=budget,
                    buffer_bytes=int(round(buffer_experts * spec.expert_bytes)),
                    initial=initial, fast_replay=None if event_loop else FAST_PATH)
    return BenchRun(engine, trace, wl, spec, hw, buffer_experts, t_gen)


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

    run = build_run(args.policy, args.tokens, prompt_len=args.prompt_len, hardware=args.hardware,
                    experts_per_layer=args.experts_per_layer, initial=args.initial, preset=args.preset,
                    model=args.model, buffer_experts=args.buffer_experts, event_loop=args.event_loop)
    engine, trace, wl, model, hw = run.engine, run.trace, run.workload, run.model, run.hardware
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
          + (f", {REQUESTS} prompts of {args.prompt_len}" if args.prompt_len else "") + f" x {model.num_layers} layers), "
          f"generated and validated in {run.t_gen:.2f} s")
    print(f"policy {args.policy} on {hw.name}, {args.experts_per_layer:g} experts/layer"
          + (f" + a {run.buffer_experts:g}-expert transfer buffer" if run.buffer_experts else "") + ": "
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
