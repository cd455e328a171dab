"""Throughput of the trace layer: the synthetic generator and the moe-trace reader.

Run: ``python benchmarks/bench_traces.py [--tokens 100000] [--preset mixtral-8x7b-legacy]``.

Each phase runs in a fresh process so that its peak memory is its own: ``peak RSS`` is the
process's maximum resident set (``ru_maxrss``) and ``+RSS`` the growth over the process
before the phase (interpreter and imports). Rows are (request, token, layer) rows.

Phases: ``generate`` (the numpy model, columns in memory), ``synthesize`` (generate, validate
and write Parquet), ``read all`` (:func:`read_trace` of every column), ``stream all``
(:func:`iter_batches`, every column, batch by batch) and ``stream experts`` (required columns
only, what a replay needs).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _phase(name: str, path: str, preset: str, requests: int, prompt: int, decode: int,
           queue: Any) -> None:
    from moesim.traces.format.trace_file import iter_batches, read_trace
    from moesim.traces.synthetic.generator import SynthParams, generate, synthesize

    params = SynthParams.from_preset(preset, requests=requests, prompt_len=prompt, decode_len=decode)
    base = _rss_mib()
    t0 = time.perf_counter()
    rows = 0
    if name == "generate":
        cols, _ = generate(params)
        rows = int(cols["request_id"].shape[0])
    elif name == "synthesize":
        _, _, rows = synthesize(params, path)
    elif name == "read all":
        rows = read_trace(path).num_rows
    elif name == "stream all":
        for batch in iter_batches(path):
            rows += int(batch["request_id"].shape[0])
    elif name == "stream experts":
        for batch in iter_batches(path, columns=[]):
            rows += int(batch["request_id"].shape[0])
    dt = time.perf_counter() - t0
    queue.put({"phase": name, "rows": rows, "seconds": dt, "rows_per_s": rows / dt,
               "peak_rss_mib": _rss_mib(), "base_rss_mib": base})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000, help="tokens in the trace (default 100000)")
    ap.add_argument("--preset", default="mixtral-8x7b-legacy", help="generator preset (default mixtral-8x7b)")
    ap.add_argument("--prompt-len", type=int, default=100, help="prompt tokens per request")
    ap.add_argument("--decode-len", type=int, default=400, help="decode tokens per request")
    ap.add_argument("--dir", default=None, help="where to write the trace (default: a temp folder)")
    args = ap.parse_args(argv)
    per_req = args.prompt_len + args.decode_len
    requests = max(1, round(args.tokens / per_req))
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = str(Path(tmp) / "bench.parquet")
        from moesim.traces.synthetic.generator import SynthParams

        shape = SynthParams.from_preset(args.preset).shape()
        print(f"preset {args.preset}: {requests} requests x {per_req} tokens = {requests * per_req:,} tokens, "
              f"{shape.num_layers} layers, E={shape.num_experts}, k={shape.top_k}")
        print(f"{'phase':<16}{'rows':>12}{'seconds':>10}{'rows/s':>14}{'peak RSS MiB':>14}{'+RSS MiB':>10}")
        for name in ("generate", "synthesize", "read all", "stream all", "stream experts"):
            q = ctx.Queue()
            proc = ctx.Process(target=_phase, args=(name, path, args.preset, requests, args.prompt_len,
                                                    args.decode_len, q))
            proc.start()
            res = q.get()
            proc.join()
            print(f"{name:<16}{res['rows']:>12,}{res['seconds']:>10.2f}{res['rows_per_s']:>14,.0f}"
                  f"{res['peak_rss_mib']:>14,.0f}{res['peak_rss_mib'] - res['base_rss_mib']:>10,.0f}")
            sys.stdout.flush()
        size = Path(path).stat().st_size
        print(f"file: {size / 2**20:,.1f} MiB ({size / (requests * per_req * shape.num_layers):.1f} bytes/row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
