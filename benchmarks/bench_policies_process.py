"""Whole-process speed of every registered policy: ``simctl run SCENARIO --out DIR`` in a child
process on the engine issue's case (Mixtral-8x7B, 2,000 decode tokens x 32 layers with lookahead
logits, ``a100-pcie-80gb``, ``cache.rate`` 0.25, each policy with its defaults and the transfer buffer
its setup needs declare, as ``simctl study`` gives it: MoEpic's ``U_b = K``), layer-steps per
second of wall time and of CPU time (the child's user + system time from ``os.wait4``), median
of ``--repeat`` processes. Prints a table and the goal of issue 24 (>= 50,000 layer-steps/s for
every policy); asserts nothing.

    python benchmarks/bench_policies_process.py [--tokens 2000] [--repeat 3] [--policies a,b]
        [--vs PYTHONPATH_DIR] [--out results/policies_process.md]

``--vs DIR`` also runs each policy with ``PYTHONPATH=DIR`` (a folder whose ``moesim/{sim,policies,
traces}`` link to another checkout), alternating with this tree's runs so that both see the same
load, and prints the ratio of the CPU-time medians: the speed-up of this tree over that one.
Both trees' bytecode is compiled first: under ``PYTHONDONTWRITEBYTECODE`` (as on the machines
this project is built on) a tree without it compiles every module in every process (~0.1 s,
a quarter of a fast policy's process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
GOAL = 50_000
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "policies", "traces")


def compile_tree(pythonpath: str | None) -> None:
    """Write the bytecode of this tree's packages, or of the checkout ``pythonpath`` links to."""
    base = ROOT if pythonpath is None else Path(pythonpath) / "moesim"
    dirs = [str((base / d).resolve()) for d in PACKAGES]
    subprocess.run([PY, "-m", "compileall", "-q", *dirs], check=True)


def child(cmd: list[str], pythonpath: str | None, must: bool = True) -> tuple[float, float] | None:
    """Run ``cmd``; its wall and CPU seconds (None if it failed and ``must`` is False)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = p.stdout.read() if p.stdout else ""
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        if not must:
            return None
        raise SystemExit(f"failed ({status}): {' '.join(cmd)}\n{out}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens (4 requests)")
    ap.add_argument("--repeat", type=int, default=3, help="processes per policy (the median is printed)")
    ap.add_argument("--policies", default="", help="comma-separated (default: every registered policy)")
    ap.add_argument("--vs", default="", help="PYTHONPATH of another checkout to compare with")
    ap.add_argument("--out", default="", help="also write the table (markdown) here")
    args = ap.parse_args()
    from moesim.policies.contract.registry import make_policy, policy_names
    from moesim.sim.config.catalog import get_model

    top_k = get_model("mixtral-8x7b").top_k

    names = args.policies.split(",") if args.policies else sorted(policy_names())
    steps = args.tokens * 32
    lines = [f"Mixtral-8x7B {args.tokens} decode tokens x 32 layers ({steps:,} layer-steps), a100-pcie-80gb, "
             f"cache.rate 0.25; median of {args.repeat} whole `simctl run --out` processes; "
             f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start. Goal: >= {GOAL:,} layer-steps/s.",
             "",
             "| policy | layer-steps/s (wall) | per CPU s | goal met |" + (" other tree per CPU s | speed-up |" if args.vs else ""),
             "| --- | --- | --- | --- |" + (" --- | --- |" if args.vs else "")]
    print("\n".join(lines), flush=True)
    compile_tree(None)
    if args.vs:
        compile_tree(args.vs)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        trace = tmp / "mixtral.parquet"
        child([PY, "-m", "moesim.sim.cli.main", "trace", "synth", "--preset", "mixtral-8x7b-legacy",
               "--set", "requests=4", "--set", f"decode_len={args.tokens // 4}", "--set", "prompt_len=0",
               "-o", str(trace)], None)
        for name in names:
            scen = tmp / f"{name}.yaml"
            size = make_policy(name).needs().buffer_size(top_k)   # without it MoEpic's prefetch never runs
            buffer = f", buffer_experts: {size:g}" if size else ""
            scen.write_text(f"trace: {trace}\nmodel: mixtral-8x7b\nhardware: a100-pcie-80gb\n"
                            f"cache: {{rate: 0.25{buffer}}}\npolicy: {name}\n")
            cmd = [PY, "-m", "moesim.sim.cli.main", "run", str(scen), "--out", str(tmp / f"out-{name}"),
                   "--force", "--no-progress"]
            ours: list[tuple[float, float]] = []
            theirs: list[tuple[float, float]] = []
            for _ in range(args.repeat):
                mine = child(cmd, None)
                assert mine is not None
                ours.append(mine)
                if args.vs:
                    other = child(cmd, args.vs, must=False)   # a policy the other tree lacks fails there
                    if other is not None:
                        theirs.append(other)
            wall = statistics.median(r[0] for r in ours)
            cpu = statistics.median(r[1] for r in ours)
            row = f"| {name} | {steps / wall:,.0f} | {steps / cpu:,.0f} | {'yes' if steps / wall >= GOAL else 'no'} |"
            if args.vs and theirs:
                cpu_b = statistics.median(r[1] for r in theirs)
                row += f" {steps / cpu_b:,.0f} | {cpu_b / cpu:.2f}x |"
            elif args.vs:
                row += " (fails there) | - |"
            print(row, flush=True)
            lines.append(row)
    if args.out:
        from results_file import write_result

        write_result(Path(args.out), "# Whole-process speed per policy\n\nWritten by `python benchmarks/"
                     f"bench_policies_process.py{' --vs DIR' if args.vs else ''}`.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
