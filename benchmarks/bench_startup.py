"""Where the time of one ``simctl run --out`` process goes: the phase breakdown of the whole
process (the fixed, per-process cost around the engine).

Run: ``python benchmarks/bench_startup.py [--policy lru] [--runs 5] [--tokens 2000] [--cpu]``.

The benchmark trace is the one of the engine speed figures: a Mixtral-8x7B batch-1 decode
trace (``--tokens`` tokens x 32 layers, 4 requests, no prompt), replayed on an A100 with
``cache.rate 0.25``. Each run is a fresh interpreter that runs ``simctl run SCENARIO --out DIR
--force --no-progress`` through :func:`moesim.sim.cli.main`, as the console script does, with
perf counters around the phases (the functions that ``simctl run`` calls are wrapped as their
modules load, nothing else changes):

- ``start-up``: from starting the process to its first line (the interpreter and ``site``);
- ``import cli``: ``import moesim.sim.cli.main`` (the command tree's modules);
- ``parse``: from :func:`main` to ``simctl run``'s function (typer's parsing);
- ``import run path``: from there to the scenario being loaded: the modules that ``simctl run``
  imports when it runs (scenario, runner, outputs and theirs);
- ``load scenario``: the scenario file read, overridden and validated;
- ``prepare``: policy, trace read, profile split, workload and engine set up;
- ``engine + metrics``: the replay, its warnings, metrics and resolved config;
- ``write``: ``config.yaml``, ``metrics.json`` and ``steps.parquet``;
- ``baselines``: the summary's speed-up over ``lru`` and ``no-cache`` (their replays,
  :mod:`moesim.sim.run.baselines`; the phases above time the run's own calls only);
- ``summary``: the printed summary;
- ``exit``: from :func:`main`'s return to the process's end (interpreter shutdown);
- ``wall``: the whole process, timed from outside (the medians of the phases need not add
  up to it exactly).

With ``--cpu`` every figure is CPU time (user + system, every thread) instead: the phases on
the process's own clock, ``start-up`` the CPU time before the first line, and ``exit`` and
the total (``cpu``) from the process's resource usage as its parent reads it (``os.wait4``),
as ``benchmarks/refresh.py`` times whole processes.

Each figure is the median over ``--runs`` runs; the 1-minute load average is printed with them
(the machine is shared: compare figures taken at the same moment).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_DRIVER = r"""
import os, time
w0 = time.time()
clock = getattr(time, os.environ.get("BENCH_CLOCK", "perf_counter"))
t0 = clock()
import moesim.sim.cli.main as cli
t1 = clock()
import functools, importlib.abc, importlib.util, json, sys
marks = {"start": t0, "imported": t1}

def wrap(obj, name, after, before=None):
    fn = getattr(obj, name)
    @functools.wraps(fn)
    def wrapper(*a, **k):
        if before is not None:
            marks.setdefault(before, clock())
        try:
            return fn(*a, **k)
        finally:
            marks.setdefault(after, clock())   # the first call: the run's own, not a baseline's
    setattr(obj, name, wrapper)

# the run path's functions are wrapped as their modules load (simctl run imports them itself)
WRAPS = {
    "moesim.sim.config.scenario": lambda m: wrap(m, "load_scenario", "loaded", before="scenario"),
    "moesim.sim.run.runner": lambda m: (wrap(m, "prepare_run", "prepared"), wrap(m.PreparedRun, "run", "ran")),
    "moesim.sim.run.outputs": lambda m: (wrap(m, "write_outputs", "written"), wrap(m, "print_summary", "printed")),
    "moesim.sim.run.baselines": lambda m: wrap(m, "speedups", "baselined"),
}

class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAPS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            WRAPS[name](module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
for info in cli.app.registered_commands:
    if info.name is None and info.callback.__name__ == "run":
        wrap(info, "callback", "done", before="parsed")
t2 = clock()
rc = cli.main(sys.argv[1:])
t3 = clock()
sys.stdout.flush()
import os
pyc = bool(cli.__cached__) and os.path.exists(cli.__cached__)
print(json.dumps({"marks": marks, "t_main": t2, "t_end": t3, "rc": rc, "w0": w0, "w_end": time.time(),
                  "c0": t0, "c_end": clock(), "pyc": pyc}), file=sys.stderr)
"""


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _run_once(python: str, scenario: Path, out: Path, cpu: bool = False) -> dict[str, float]:
    """One fresh process: its phases in seconds (of wall time, or with ``cpu`` of the process's
    CPU time: its own clock inside, its resource usage from outside)."""
    env = {**os.environ, "BENCH_CLOCK": "process_time" if cpu else "perf_counter"}
    w0 = time.time()
    proc = subprocess.Popen([python, "-c", _DRIVER, "run", str(scenario), "--out", str(out), "--force",
                             "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    stderr = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)   # its resource usage: CPU time of the whole process
    proc.returncode = os.waitstatus_to_exitcode(status)
    w1 = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"simctl run failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    data = json.loads(stderr.strip().splitlines()[-1])
    m = data["marks"]
    if cpu:
        total = usage.ru_utime + usage.ru_stime
        start, end = data["c0"], total - data["c_end"]
    else:
        total, start, end = w1 - w0, data["w0"] - w0, w1 - data["w_end"]
    return {
        "start-up": start,
        "import cli": m["imported"] - m["start"],
        "parse": m["parsed"] - data["t_main"],
        "import run path": m["scenario"] - m["parsed"],
        "load scenario": m["loaded"] - m["scenario"],
        "prepare": m["prepared"] - m["loaded"],
        "engine + metrics": m["ran"] - m["prepared"],
        "write": m["written"] - m["ran"],
        "baselines": m.get("baselined", m["written"]) - m["written"],
        "summary": m["printed"] - m.get("baselined", m["written"]),
        "exit": end,
        "wall": total,
        "pyc": float(data["pyc"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Build the benchmark trace and scenario, time ``--runs`` processes, print the phases."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--policy", default="lru", help="policy of the scenario (default lru)")
    ap.add_argument("--runs", type=int, default=5, help="processes timed (default 5, after one warm-up)")
    ap.add_argument("--tokens", type=int, default=2000, help="decode tokens in the trace, over 4 requests (default 2000)")
    ap.add_argument("--python", default=sys.executable, help="interpreter to time (default: this one)")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU time of the process (user + system, all threads) instead of wall time")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        d = Path(tmp)
        trace = d / "mixtral.parquet"
        subprocess.run([args.python, "-m", "moesim.sim.cli.main", "trace", "synth", "--preset", "mixtral-8x7b-legacy",
                        "--set", "requests=4", "--set", f"decode_len={args.tokens // 4}", "--set", "prompt_len=0",
                        "-o", str(trace)], check=True, capture_output=True)
        scenario = d / "scenario.yaml"
        scenario.write_text(f"trace: {trace}\nmodel: mixtral-8x7b\nhardware: a100-pcie-80gb\n"
                            f"cache: {{rate: 0.25}}\npolicy: {args.policy}\n")
        _run_once(args.python, scenario, d / "out")   # warm-up (file cache)
        runs = [_run_once(args.python, scenario, d / "out", cpu=args.cpu) for _ in range(args.runs)]
    load = os.getloadavg()[0]
    pyc = all(r.pop("pyc") for r in runs)
    med = {n: _median([r[n] for r in runs]) for n in runs[0]}
    steps = (args.tokens // 4) * 4 * 32
    clock = "CPU time" if args.cpu else "wall time"
    print(f"simctl run --out, policy {args.policy}, {steps:,} layer-steps; {clock}, median of {args.runs} processes; "
          f"load {load:.2f} on {os.cpu_count()} cores")
    if not pyc:
        print("  (no bytecode cache for moesim's modules: each process compiles them from source, "
              "as under PYTHONDONTWRITEBYTECODE=1 with an editable install)")
    for n, v in med.items():
        if n != "wall":
            print(f"  {n:18s} {v * 1e3:8.1f} ms")
    rest = med["wall"] - sum(v for n, v in med.items() if n != "wall")
    print(f"  {'(rest)':18s} {rest * 1e3:8.1f} ms   (this script's own set-up in the process; noise)")
    per = " per CPU second" if args.cpu else "/s"
    print(f"  {'cpu' if args.cpu else 'wall':18s} {med['wall'] * 1e3:8.1f} ms   = {steps / med['wall']:,.0f} layer-steps{per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
