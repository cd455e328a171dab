"""Overhead of the moe-trace tracer: generation with and without the recording hooks.

CPU (default): a small Mixtral (hidden 256, intermediate 896, 4 layers, 8 experts, top-2,
vocab 32000) with random weights, a few prompts of random token ids, 32 new tokens each.
CUDA (``--device cuda``): a real-shaped Mixtral layer stack (hidden 4096, intermediate 14336,
32 heads, 8 KV heads, 8 experts, top-2, vocab 32000; ``--layers`` of them, default 4) in
bfloat16 with random weights built on the GPU.

Every configuration runs the same greedy KV-cache loop (:func:`traces.tracer.generate_ids`):

* ``baseline``: no hooks;
* ``trace (all columns)``: hooks recording experts, weights, logits, lookahead logits,
  token ids and iteration embeddings, plus the per-request host copy;
* ``trace (experts only)``: hooks recording experts only (no lookahead router calls);

and, separately, the time to build the columns and write the Parquet file. Each is timed
``--repeats`` times, interleaved prompt by prompt, after one warm-up; the median is reported,
overhead in % against the baseline median; the minimum is shown too. On CPU the process's CPU
time is reported next to wall time: on a shared machine it is the figure least disturbed by
other processes.

    python benchmarks/bench_tracer.py                   # CPU
    python benchmarks/bench_tracer.py --device cuda     # GPU, real Mixtral shapes
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_model(device: str, layers: int, *, seed: int = 0) -> Any:
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    if device == "cpu":
        shape = dict(hidden_size=256, intermediate_size=896, num_attention_heads=8, num_key_value_heads=4)
        dtype = torch.float32
    else:
        shape = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
        dtype = torch.bfloat16
    cfg = transformers.AutoConfig.for_model(
        "mixtral", vocab_size=32000, num_hidden_layers=layers, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=4096, **shape)
    with torch.random.fork_rng(devices=[0] if device.startswith("cuda") else []), torch.device(device):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (all MoE)")
    ap.add_argument("--prompts", type=int, default=4, help="number of prompts")
    ap.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from moesim.traces.tracer import tracer

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = build_model(args.device, args.layers)
    _sync(args.device)
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompts = [tuple(int(t) for t in rng.integers(0, 32000, args.prompt_len)) for _ in range(args.prompts)]
    gen_kw: dict[str, Any] = dict(max_new_tokens=args.new_tokens, stop_token_ids=())

    def baseline(p: tuple[int, ...]) -> None:
        tracer.generate_ids(model, p, **gen_kw)
        _sync(args.device)

    def traced(columns: frozenset[str]) -> Callable[[tuple[int, ...]], None]:
        def run(p: tuple[int, ...]) -> None:
            # hooks on for this call only (attaching them is part of the measured cost)
            with tracer.Tracer(model, columns=columns) as tr:
                tr.generate(p, **gen_kw)
            _sync(args.device)
        return run

    cases: dict[str, Callable[[tuple[int, ...]], None]] = {
        "baseline (no hooks)": baseline,
        "trace (all columns)": traced(tracer.ALL_OPTIONAL),
        "trace (experts only)": traced(frozenset()),
    }
    for fn in cases.values():  # warm-up
        fn(prompts[0])
    # interleaved per prompt, so that drift and other processes hit every case alike; CPU
    # time of this process is reported next to wall time (on a shared CPU it is the steadier)
    wall: dict[str, list[float]] = {name: [0.0] * args.repeats for name in cases}
    cpu: dict[str, list[float]] = {name: [0.0] * args.repeats for name in cases}
    for r in range(args.repeats):
        for p in prompts:
            for name, fn in cases.items():
                w, c = time.perf_counter(), time.process_time()
                fn(p)
                wall[name][r] += time.perf_counter() - w
                cpu[name][r] += time.process_time() - c
    times = wall

    # columns + Parquet write, once
    t = time.perf_counter()
    res = tracer.trace_model(model, [tracer.Prompt(p) for p in prompts], name="bench-mixtral",
                             max_new_tokens=args.new_tokens, stop_at_eos=False)
    trace_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = tracer.record_trace(Path(tmp) / "bench.parquet", res)
        write_s = time.perf_counter() - t
        size = path.stat().st_size

    cfg = model.config
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {dev}; torch {torch.__version__}")
    print(f"model: Mixtral hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, {cfg.num_hidden_layers} "
          f"layers, {cfg.num_local_experts} experts, top-{cfg.num_experts_per_tok}, vocab {cfg.vocab_size}, "
          f"{next(model.parameters()).dtype} (built in {build_s:.1f} s)")
    tokens = args.prompts * args.new_tokens
    print(f"workload: {args.prompts} prompts x {args.prompt_len} tokens, {args.new_tokens} new tokens each "
          f"({tokens} generated), median of {args.repeats} after a warm-up")
    for label, table in (("wall", times), ("cpu", cpu)):
        if label == "cpu" and args.device != "cpu":
            continue
        base = statistics.median(table["baseline (no hooks)"])
        base_min = min(table["baseline (no hooks)"])
        print(f" {label} time:")
        for name, ts in table.items():
            med, low = statistics.median(ts), min(ts)
            over = "" if name.startswith("baseline") else (
                f"  overhead {100 * (med / base - 1):+5.1f} % (median), {100 * (low / base_min - 1):+5.1f} % (min)")
            print(f"  {name:22s} median {med * 1e3:8.1f} ms, min {low * 1e3:8.1f} ms "
                  f"({1e3 * med / tokens:6.2f} ms/token){over}")
    print(f"  trace_model (all columns, incl. columns) {trace_s * 1e3:.1f} ms; write_trace {write_s * 1e3:.1f} ms "
          f"({res.num_rows} rows, {size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
