"""Refresh ``benchmarks/README.md``: run every speed and memory benchmark of the engine issue
and write one table of the current figures, each with the command behind it and the machine's
load beside it.

    python benchmarks/refresh.py [--memory-rows 256000] [--quick]

Whole-process figures run ``simctl`` in a child process and take its wall time and CPU time
(``os.wait4``'s rusage); in-process figures come from the printing scripts beside this one
(``bench_engine.py``, ``bench_curve.py``, ``bench_memory.py``), whose lines are copied into
the table. On a shared machine wall time depends on the load: the CPU-time figures are the
steadier ones. ``--quick`` uses shorter traces (for trying the script, not for the README).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PY = sys.executable


def load() -> str:
    """The 1-minute load average and the core count."""
    return f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def child(cmd: list[str]) -> tuple[float, float, int, str]:
    """Run ``cmd``; its wall seconds, CPU seconds (user + sys), peak RSS in KiB, and stdout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    out = p.stdout.read() if p.stdout else ""
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"failed ({status}): {' '.join(cmd)}\n{out}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, out


def grab(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    if not m:
        raise SystemExit(f"no {pattern!r} in:\n{text}")
    return m.group(1)


def rel(cmd: list[str]) -> str:
    """A command as a reader would type it from the repository root."""
    return " ".join("python" if c == PY else str(c).replace(str(ROOT) + "/", "") for c in cmd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory-rows", type=int, default=256_000, help="trace rows of the memory figure")
    ap.add_argument("--quick", action="store_true", help="short traces (to try the script)")
    args = ap.parse_args()
    tokens = 400 if args.quick else 2000
    rows: list[tuple[str, str, str, str, str]] = []   # figure, value, goal, command, load
    # the package's bytecode, as `pip install` compiles it: an editable install under
    # PYTHONDONTWRITEBYTECODE (as on the machines this project is built on) has none, and every
    # process would compile ~85 modules from source (~0.1 s)
    subprocess.run([PY, "-m", "compileall", "-q", *(str(ROOT / d) for d in ("sim", "policies", "traces"))],
                   check=True)

    def add(figure: str, value: str, goal: str, cmd: list[str] | str, at: str) -> None:
        rows.append((figure, value, goal, cmd if isinstance(cmd, str) else rel(cmd), at))
        print(f"{figure}: {value}  [{at}]", flush=True)

    # the whole-process goals of the engine issue (issue 24, item 4): each policy on a trace of its
    # own length (4 requests, no prompt), as `simctl run SCENARIO --out DIR` runs it
    whole = (("mixtral-offloading", 4000, ">= 100,000"), ("lru", 20000, ">= 300,000"))
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for policy, n_tok, goal in whole:
            n_tok = n_tok // 10 if args.quick else n_tok
            trace = tmp / f"mixtral-{n_tok}.parquet"
            synth = [PY, "-m", "moesim.sim.cli.main", "trace", "synth", "--preset", "mixtral-8x7b-legacy", "--set",
                     "requests=4", "--set", f"decode_len={n_tok // 4}", "--set", "prompt_len=0", "-o", str(trace)]
            child(synth)
            steps = n_tok * 32
            scen = tmp / f"{policy}.yaml"
            scen.write_text(f"trace: {trace}\nmodel: mixtral-8x7b\nhardware: a100-pcie-80gb\n"
                            f"cache: {{rate: 0.25}}\npolicy: {policy}\n")
            cmd = [PY, "-m", "moesim.sim.cli.main", "run", str(scen), "--out", str(tmp / f"out-{policy}"), "--force",
                   "--no-progress"]
            at = load()
            runs = [child(cmd)[:2] for _ in range(3)]   # the median of 3 processes
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            add(f"`simctl run --out`, {policy}, Mixtral {n_tok:,} tokens x 32 layers, A100, rate 0.25: "
                "layer-steps/s of the whole process (median of 3 processes)",
                f"{steps / wall:,.0f} wall, {steps / cpu:,.0f} per CPU s", goal,
                f"python -m moesim.sim.cli.main trace synth --preset mixtral-8x7b-legacy --set requests=4 --set "
                f"decode_len={n_tok // 4} --set prompt_len=0 -o mixtral.parquet; simctl run SCENARIO --out DIR "
                f"(trace: mixtral.parquet, hardware: a100-pcie-80gb, cache.rate 0.25, policy {policy})", at)

    engine_runs = [
        ("engine only, lru (fast path, lru kernel), Mixtral", ["--policy", "lru"], ">= 300,000"),
        ("engine only, lfu (fast path, lfu kernel), Mixtral", ["--policy", "lfu"], ">= 300,000"),
        ("engine only, fifo (fast path, fifo kernel), Mixtral", ["--policy", "fifo"], ">= 300,000"),
        ("engine only, random (fast path, random kernel), Mixtral", ["--policy", "random"], ">= 300,000"),
        ("engine only, belady (fast path, belady kernel), Mixtral", ["--policy", "belady"], ">= 300,000"),
        ("engine only, static with its set placed at the start (fast path, static kernel), Mixtral, 4 experts "
         "per layer", ["--policy", "static", "--initial", "popular", "--experts-per-layer", "4"], ">= 300,000"),
        ("engine only, lru forced through the SimPy event loop, Mixtral", ["--policy", "lru", "--event-loop"],
         "(reference)"),
        ("engine only, mixtral-offloading (fast path, mixtral-offloading kernel), Mixtral",
         ["--policy", "mixtral-offloading"], "(whole process >= 100,000)"),
        ("engine only, mixtral-offloading forced through the SimPy event loop, Mixtral",
         ["--policy", "mixtral-offloading", "--event-loop"], "(reference)"),
    ]
    for label, extra, goal in engine_runs:
        cmd = [PY, str(HERE / "bench_engine.py"), "--tokens", str(tokens), *extra]
        at = load()
        walls, cpus = [], []
        for _ in range(3):   # one run of a second or two can fall in a slow spell: the median of 3
            out = child(cmd)[3]
            walls.append(float(grab(r"([\d,]+) layer-steps/s", out).replace(",", "")))
            cpus.append(float(grab(r"([\d,]+) layer-steps per CPU second", out).replace(",", "")))
        wall_rate, cpu_rate = statistics.median(walls), statistics.median(cpus)
        add(label + ": layer-steps/s (median of 3 runs)", f"{wall_rate:,.0f} wall, {cpu_rate:,.0f} per CPU s "
            f"(runs {min(cpus):,.0f}-{max(cpus):,.0f})", goal, cmd, at)

    # a ratio of two single runs on a shared machine swings by +-20%: five pairs, run back to
    # back, and the median of the pair ratios
    cmd = [PY, str(HERE / "bench_engine.py"), "--policy", "lru", "--tokens", str(tokens // 4),
           "--model", "deepseek-v3", "--experts-per-layer", "64"]
    mix_cmd = [PY, str(HERE / "bench_engine.py"), "--tokens", str(tokens), "--policy", "lru"]
    at = load()
    ratios, dss = [], []
    for _ in range(5):
        ds = float(grab(r"([\d,]+) layer-steps per CPU second", child(cmd)[3]).replace(",", ""))
        mix = float(grab(r"([\d,]+) layer-steps per CPU second", child(mix_cmd)[3]).replace(",", ""))
        ratios.append(mix / ds)
        dss.append(ds)
    ratio = statistics.median(ratios)
    add("per-step cost, DeepSeek-V3 shape (58 layers x 256 experts, top-8, 64 cached per layer) / Mixtral "
        "(32 x 8, top-2, 2 cached), lru fast path, median of 5 back-to-back pairs; per expert access (a step "
        "runs 8 vs 2)",
        f"{ratio:.2f}x per step (pairs {min(ratios):.2f}-{max(ratios):.2f}; {statistics.median(dss):,.0f} steps "
        f"per CPU s); {ratio * 2 / 8:.2f}x per access", "<= 2x", cmd, at)

    helps, help_cpu = [], []
    at = load()
    for _ in range(5):
        wall, cpu, _, _ = child([str(Path(PY).parent / "simctl"), "--help"])
        helps.append(wall)
        help_cpu.append(cpu)
    add("`simctl --help` (median of 5)", f"{statistics.median(helps):.2f} s wall, "
        f"{statistics.median(help_cpu):.2f} s CPU", "< 0.3 s", "simctl --help", at)

    for preset, n in (("mixtral-8x7b-legacy", tokens), ("olmoe-1b-7b-legacy", tokens // 2)):
        cmd = [PY, str(HERE / "bench_curve.py"), "--preset", preset, "--tokens", str(n)]
        at = load()
        _, _, _, out = child(cmd)
        ours = grab(r"one pass each\): ([\d.]+) s", out)
        theirs = grab(r"in C\): ([\d.]+) s", out)
        same = grab(r"counts equal: (\w+)", out)
        add(f"hit-rate curves, every size, LRU + Belady, {preset} {n} tokens: simctl curve vs libcachesim",
            f"{ours} s vs {theirs} s, counts equal: {same}", "faster, equal counts", cmd, at)

    rows_mem = 64_000 if args.quick else args.memory_rows
    big = 300_000 if args.quick else 3_000_000   # the engine issue's memory goal: 3M rows under 1 GiB
    for rows_n, policies, extra, goal in ((rows_mem, "lru,mixtral-offloading", [], "< 2 GB at 10M rows"),
                                          (4 * rows_mem, "lru", [], "< 2 GB at 10M rows"),
                                          (big, "lru,mixtral-offloading", ["--out"], "< 1 GiB at 3M rows")):
        cmd = [PY, str(HERE / "bench_memory.py"), "--rows", str(rows_n), "--policies", policies, *extra]
        at = load()
        _, _, _, out = child(cmd)
        how = "`simctl run --out` (step records written)" if extra else "`simctl run`"
        for policy in policies.split(","):
            m = re.search(rf"^{re.escape(policy)}\s+([\d.]+)\s+(\d+)\s+([\d,]+)", out, re.M)
            if not m:
                raise SystemExit(f"no {policy} row in:\n{out}")
            add(f"peak RSS of {how}, {rows_n:,}-row Mixtral trace with every column, {policy}",
                f"{int(m.group(2)):,} MiB ({m.group(1)} s wall)", goal, cmd, at)

    if args.quick:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [
        "# Benchmarks: current figures",
        "",
        f"Refreshed by `python benchmarks/refresh.py` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"commit {commit}, Python {sys.version.split()[0]}, {os.cpu_count()} cores. The machine is shared: the "
        "load column is the 1-minute load average when the figure was taken; wall-time rates fall with it, "
        "the per-CPU-second rates much less. The package's bytecode is compiled first, as `pip install` "
        "does. Goals are those of the engine speed issue.",
        "",
        "| figure | value | goal | command | load |",
        "| --- | --- | --- | --- | --- |",
    ]
    for fig, val, goal, cmd, at in rows:
        lines.append(f"| {fig} | {val} | {goal} | `{cmd}` | {at} |")
    lines += [
        "",
        "Other scripts here print figures of their own (`bench_sweep.py`, `bench_traces.py`, `bench_tracer.py`, "
        "`bench_eventpath_policies.py`, `bench_policies_process.py`: every policy's whole `simctl run` process, with `--vs` another tree, output in `results/policies_process.md`, `bench_startup.py`: the phases of one `simctl run --out` process, in wall time or with `--cpu` in CPU time, and `policy_share.py`: the shares of a run's CPU time in the policy's own code and in the engine's) "
        "or reproduce papers' tables (`*_table.py`, `paper_runs.py`, `crosscheck_libcachesim.py`); "
        "`fit_presets.py` and `routing_rankings.py` compare the synthetic presets with published routing "
        "statistics and rank policies on recorded and fitted routing, and `scenario_presets.py` runs each "
        "paper scenario on its fitted preset beside the `-legacy` one it ran before, and `routing_swap.py` runs a "
        "measurement set's rows at its committed fit on the set's trace and on a changed one (outputs in `results/`, "
        "`results/routing_swap/`). The speed "
        "figures above use the `-legacy` presets.",
        "",
    ]
    (HERE / "README.md").write_text("\n".join(lines))
    print(f"wrote {HERE / 'README.md'}")


if __name__ == "__main__":
    main()
