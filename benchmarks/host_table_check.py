"""The simulator's CPU-expert policies on a committed GPU profile, with the host expert priced
two ways: the line ``cpu.expert_us + cpu.expert_us_per_token x (n - 1)`` the profile carries, and
every token count's measured time (``cpu.expert_us_by_tokens``, added here from the profile's own
stored ``measurements.host_experts``, as ``simctl calibrate`` now writes it). No device needed:
it re-simulates what ``benchmarks/validate_gpu_host_paths.sh`` compared, for comparison with the
executor's figures in its tables (``benchmarks/results/gpu/validate_h200_host_paths.md``).

    python benchmarks/host_table_check.py [--profile benchmarks/results/gpu/h200-host-paths-profile.yaml]

Prints one markdown table: policy, rate, TPOT p50 and TTFT mean (ms), line and table.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    import yaml

    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.real.validate import simulate
    from moesim.sim.run.runner import load_trace

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--profile", default=str(ROOT / "benchmarks/results/gpu/h200-host-paths-profile.yaml"))
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/validate-h200-host-paths.yaml"))
    ap.add_argument("--policies", nargs="+", default=["cpu-moe"])
    ap.add_argument("--rates", nargs="+", type=float, default=[0.25, 0.5])
    args = ap.parse_args(argv)
    line = yaml.safe_load(Path(args.profile).read_text())
    rows = line.get("measurements", {}).get("host_experts")
    if not rows:
        print(f"{args.profile}: no measurements.host_experts to build the table from", file=sys.stderr)
        return 2
    table = copy.deepcopy(line)
    table["hardware"]["cpu"].pop("expert_us_by_tokens", None)
    line["hardware"]["cpu"].pop("expert_us_by_tokens", None)
    table["hardware"]["cpu"]["expert_us_by_tokens"] = {int(r["tokens"]): round(r["s"] * 1e6, 3) for r in rows}
    shown = Path(args.profile).resolve()
    print(f"profile: {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}\n")
    print("| policy | rate | TPOT p50 line | TPOT p50 table | TTFT line | TTFT table |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, prof in (("line", line), ("table", table)):
            paths[name] = Path(tmp) / f"{name}.yaml"
            paths[name].write_text(yaml.safe_dump(prof))
        for pol in args.policies:
            for rate in args.rates:
                loaded = load_scenario(args.scenario, [f"policy={pol}", f"cache.rate={rate}"])
                trace = load_trace(loaded)
                spec = loaded.model_spec(trace.model.name)
                m = {name: simulate(loaded, spec, path, trace) for name, path in paths.items()}
                print(f"| {pol} | {rate:g} | {m['line']['tpot_ms']['p50']:.2f} | {m['table']['tpot_ms']['p50']:.2f} | "
                      f"{m['line']['ttft_ms']['mean']:.2f} | {m['table']['ttft_ms']['mean']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
