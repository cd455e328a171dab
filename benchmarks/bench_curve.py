"""Hit-rate curves: ``simctl curve``'s one-pass LRU and Belady against libCacheSim simulating
every cache size, side by side on the same per-layer streams; the counts must be equal.

libCacheSim runs in C (``process_trace`` over an ``oracleGeneral`` binary trace per layer, one
cache per size, ``hashpower=10``); writing those files is not timed. Prints figures; asserts
only that the counts agree.

    python benchmarks/bench_curve.py [--preset mixtral-8x7b-legacy] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from moesim.sim.engine.workload import build_workload
from moesim.traces.analysis.curve import curves, next_use
from moesim.traces.format.trace_file import trace_from_columns
from moesim.traces.synthetic.generator import SynthParams, generate

ORACLE = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def layer_streams(preset: str, tokens: int) -> tuple[list[np.ndarray], int, str]:
    """Per-layer expert streams of a synthetic decode trace (4 requests), and the expert count."""
    params = SynthParams.from_preset(preset, requests=4, prompt_len=0, decode_len=tokens // 4, seed=0)
    cols, meta = generate(params)
    trace = trace_from_columns(cols, meta)
    wl = build_workload(trace, batch_size=1, phases=["decode"])
    rows0 = np.concatenate([it.rows0 for it in wl.iterations])
    m = trace.model
    return ([trace.experts[rows0 + layer].reshape(-1).astype(np.int64) for layer in range(m.num_layers)],
            m.num_experts, f"{m.name} ({m.num_layers} layers x {m.num_experts} experts, top-{m.top_k})")


def libcachesim_counts(streams: list[np.ndarray], num_experts: int, tmp: Path) -> tuple[dict[str, np.ndarray], float]:
    """Hits per (policy, layer, size) from libCacheSim, and the seconds its simulations took."""
    import libcachesim as lcs

    files = []
    for layer, s in enumerate(streams):
        nxt = next_use(s)
        rec = np.zeros(s.size, dtype=ORACLE)
        rec["t"] = np.arange(s.size)
        rec["id"] = s + 1
        rec["size"] = 1
        rec["next"] = np.where(nxt < s.size, nxt, np.iinfo(np.int64).max)
        path = tmp / f"layer{layer}.oracleGeneral.bin"
        rec.tofile(path)
        files.append(path)
    out = {p: np.zeros((len(streams), num_experts + 1), dtype=np.int64) for p in ("lru", "belady")}
    t0 = time.perf_counter()
    for pol, cls in (("lru", lcs.LRU), ("belady", lcs.Belady)):
        for layer, path in enumerate(files):
            n = streams[layer].size
            for size in range(1, num_experts + 1):
                reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
                miss_ratio = cls(size, hashpower=10).process_trace(reader)[0]
                out[pol][layer, size] = round((1 - miss_ratio) * n)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="mixtral-8x7b-legacy", help="synthetic trace preset (model shape)")
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens")
    args = ap.parse_args()
    streams, E, what = layer_streams(args.preset, args.tokens)
    refs = sum(s.size for s in streams)
    t0 = time.perf_counter()
    cur = curves(streams, E)
    ours = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        peer, theirs = libcachesim_counts(streams, E, Path(tmp))
    same = np.array_equal(peer["lru"], cur.lru) and np.array_equal(peer["belady"], cur.belady)
    print(f"trace: {what}, {args.tokens} decode tokens, {refs} references; sizes 1..{E} per layer")
    print(f"simctl curve (LRU + Belady, one pass each): {ours:.3f} s")
    print(f"libcachesim (LRU + Belady, {2 * E * len(streams)} simulations in C): {theirs:.3f} s")
    print(f"speed-up {theirs / ours:.1f}x; counts equal: {same}")
    if not same:
        raise SystemExit("counts differ")


if __name__ == "__main__":
    main()
