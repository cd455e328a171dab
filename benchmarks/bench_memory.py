"""Peak memory of a replay against trace size, and what column projection saves.

Synthesises a Mixtral-shaped trace with every optional column (logits, lookahead logits,
weights, embeddings) to a temporary file, then runs `simctl run` on it in a child process for
each policy given, and prints rows, wall time and the child's peak RSS (ru_maxrss). `lru` reads
only the routing; `mixtral-offloading` also the lookahead logits. By default the child prints
`--json` (no step records kept); with `--out` it runs as `simctl run SCENARIO --out DIR`
does: step records kept and written to `steps.parquet`, the summary's baselines run.

    python benchmarks/bench_memory.py [--rows 256000] [--policies lru,mixtral-offloading] [--out]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256_000, help="trace rows (tokens x 32 layers)")
    ap.add_argument("--policies", default="lru,mixtral-offloading")
    ap.add_argument("--out", action="store_true", help="run with --out DIR (step records written), not --json")
    args = ap.parse_args()
    tokens = max(1, args.rows // 32)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "mixtral.parquet"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "moesim.sim.cli.main", "trace", "synth", "--preset", "mixtral-8x7b-legacy",
                        "--set", "requests=8", "--set", f"decode_len={tokens // 8}", "--set", "prompt_len=0",
                        "-o", str(trace)], check=True, stdout=subprocess.DEVNULL)
        size = trace.stat().st_size
        print(f"trace: {tokens // 8 * 8 * 32} rows, {size / 2**20:.1f} MiB on disk, "
              f"synthesised in {time.perf_counter() - t0:.1f} s")
        scen = Path(tmp) / "s.yaml"
        print(f"{'policy':<22}{'wall s':>9}{'peak RSS MiB':>14}{'layer-steps/s':>15}")
        for policy in args.policies.split(","):
            scen.write_text(f"trace: {trace}\nmodel: mixtral-8x7b\nhardware: a100-pcie-80gb\n"
                            f"cache: {{rate: 0.25}}\npolicy: {policy}\n")
            t0 = time.perf_counter()
            mode = ["--out", str(Path(tmp) / f"out-{policy}"), "--force"] if args.out else ["--json"]
            child = subprocess.Popen([sys.executable, "-m", "moesim.sim.cli.main", "run", str(scen), *mode,
                                      "--no-progress"], stdout=subprocess.DEVNULL,
                                     env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - t0
            if status != 0:
                raise SystemExit(f"simctl run failed for {policy} (status {status})")
            print(f"{policy:<22}{wall:>9.1f}{usage.ru_maxrss / 1024:>14.0f}{tokens // 8 * 8 * 32 / wall:>15,.0f}")


if __name__ == "__main__":
    main()
