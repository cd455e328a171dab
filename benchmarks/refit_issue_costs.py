"""Redo a calibration profile's two simulator-derived fits from its stored measurements.

``runtime.demand_load_us`` and ``runtime.prefetch_issue_us`` are not timed directly: ``simctl
calibrate`` derives them by running the simulator on the executor runs it measured
(:mod:`moesim.sim.real.calibration.executor_runs`). When that derivation changes, a profile measured
on a machine that is no longer at hand (a lent GPU) can be refitted from its ``measurements:``
without the device. The executor runs replayed the decode of requests of a trace recorded or
synthesised for the model; give the same trace (``--trace``) or the scenario that generates it
(``--scenario``). Writes the refitted profile (``--out``) and prints old and new values.

    python benchmarks/refit_issue_costs.py benchmarks/results/gpu/h100-mixtral-profile.yaml \\
        --scenario scenarios/validate-h100-mixtral.yaml --out h100-refit.yaml
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    """Refit and write the profile; 2 with one line on bad input."""
    from moesim.sim.config.catalog import get_model
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.core.errors import MoesimError
    from moesim.sim.real.calibration.executor_runs import (
        calibration_workload,
        demand_load_cost,
        prefetch_issue_cost,
    )
    from moesim.sim.real.calibration.profile import write_profile
    from moesim.sim.run.runner import load_trace
    from moesim.traces.format.trace_file import read_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="the trace the calibration's executor runs replayed")
    src.add_argument("--scenario", help="a scenario whose trace (file or synthetic) it was")
    ap.add_argument("--out", required=True, help="refitted profile YAML to write")
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    args = ap.parse_args(argv)
    try:
        prof = yaml.safe_load(Path(args.profile).read_text())
        meas = prof["measurements"]
        runs = meas["executor_runs"]
        spec = get_model(prof["model"])
        trace = read_trace(args.trace) if args.trace else load_trace(load_scenario(args.scenario))
        found = re.search(r"requests \[([\d, ]+)\]", str(runs.get("routing", "")))
        if found is None:
            raise MoesimError(f"{args.profile}: its executor runs replayed random routing, not a trace; "
                              "a refit needs the routing they replayed")
        requests = [int(r) for r in found.group(1).split(",")]
        workload = calibration_workload(spec, (trace, requests), context=int(meas["context"]), tokens=0,
                                        seed=int(runs["seed"]))
        runtime = {k: v for k, v in prof["runtime"].items() if k != "source"}
        demand = demand_load_cost(spec, workload, runs, prof["hardware"], dict(runtime, demand_load_us=0.0))
        runtime["demand_load_us"] = round(demand["demand_load_us"], 3)
        issue = prefetch_issue_cost(spec, workload, runs, prof["hardware"], dict(runtime, prefetch_issue_us=0.0))
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        print(f"{args.profile}: not a calibration profile with stored executor runs ({exc})", file=sys.stderr)
        return 2
    except MoesimError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    new = copy.deepcopy(prof)
    new["runtime"]["demand_load_us"] = runtime["demand_load_us"]
    new["runtime"]["prefetch_issue_us"] = round(issue["prefetch_issue_us"], 3)
    new["runtime"]["source"] += (f"; refitted from these measurements by benchmarks/{Path(__file__).name}: "
                                 f"demand_load_us {new['runtime']['demand_load_us']:.1f}, prefetch_issue_us "
                                 f"{new['runtime']['prefetch_issue_us']:.1f}" + (" (copy-bound: each prefetch's share of "
                                 "the excess)" if issue.get("copy_bound") else ""))
    new["measurements"]["demand_load_fit"], new["measurements"]["prefetch_issue_fit"] = demand, issue
    write_profile(new, args.out, force=args.force)
    for key in ("demand_load_us", "prefetch_issue_us"):
        print(f"{key}: {prof['runtime'][key]:.3f} -> {new['runtime'][key]:.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
