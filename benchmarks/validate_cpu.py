"""Simulator against the real executor on this machine's CPU (or GPU, ``--device cuda``): policies x
cache rates.

Calibrates (``simctl calibrate`` on the scenario's model shape) before and after the executor runs and
simulates with the calibration during which the machine was least disturbed (or, ``--use-profile``,
simulates with a profile calibrated beforehand and does not calibrate); for each policy and
cache rate runs ``scenarios/validate-cpu.yaml`` on the executor (the scenario's model: the bundled
trained tiny MoE by default, ``--model random`` for random weights of its shape; copies on a copy
thread) and in the simulator with the calibrated profile, and prints one markdown
table: TPOT p50 / mean, TTFT, hit rate and H2D bytes, simulated vs measured, error in %.

    python benchmarks/validate_cpu.py [--policies lru lfu fifo belady mixtral-offloading] [--rates 0.25 0.5 0.75]
    python benchmarks/validate_cpu.py --device cuda --scenario scenarios/validate-h100-mixtral.yaml \
        --use-profile h100-profile.yaml --policies lru mixtral-offloading --rates 0.25 0.5

Speed figures, never assertions: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """Print the validation table."""
    import yaml

    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.real.calibration.awake import cpus_awake
    from moesim.sim.real.calibration.profile import calibrate, write_profile
    from moesim.sim.real.executor.model import load, model_argument
    from moesim.sim.real.validate import (
        best_of_runs,
        calibration_inputs,
        compare,
        execute,
        simulate,
    )
    from moesim.sim.run.runner import load_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/validate-cpu.yaml"))
    ap.add_argument("--policies", nargs="+", default=["lru", "lfu", "fifo", "belady", "mixtral-offloading"])
    ap.add_argument("--rates", nargs="+", type=float, default=[0.25, 0.5, 0.75])
    ap.add_argument("--profile", default="runs/validate-cpu/profile.yaml")
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    ap.add_argument("--repeats", type=int, default=3, help="executor runs per point (timings: the best of them)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--use-profile", default=None, help="simulate with this profile (from `simctl calibrate` on "
                    "the same device and model shape) instead of calibrating before and after the runs")
    ap.add_argument("--model", default=None, help="model directory, catalog name or 'random' "
                    "(default: the scenario's model; tiny-moe is the bundled trained model)")
    ap.add_argument("--policy-params", default=None, help="YAML mapping of policy names to their parameters, "
                    "e.g. '{accelerate: {stream_non_expert: false}}'")
    args = ap.parse_args(argv)
    try:
        params = yaml.safe_load(args.policy_params) if args.policy_params else {}
    except yaml.YAMLError:
        params = None
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        ap.error(f"--policy-params {args.policy_params!r}: not a mapping of policy names to parameter mappings")

    from moesim.traces.tracer.model_loading import resolve_device

    device = resolve_device(args.device)
    base = load_scenario(args.scenario)
    trace = load_trace(base)
    ref, spec = model_argument(args.model, base.model_spec(trace.model.name))
    om = load(ref, spec, device)
    context, routing = calibration_inputs(base, trace)
    points = [(pol, rate) for pol in args.policies for rate in args.rates]

    def policy_set(pol: str) -> str:
        return f"policy={pol}" if pol not in params else "policy=" + yaml.safe_dump(
            {"name": pol, "params": params[pol]}, default_flow_style=True).strip()
    scenarios = {pt: load_scenario(args.scenario, [policy_set(pt[0]), f"cache.rate={pt[1]}"]) for pt in points}
    # calibrated before and after the executor runs; the calibration during which the machine was
    # least disturbed (the faster resident executor step it measured) is the one simulated
    on_cpu = device.type == "cpu"
    t0 = time.time()
    if args.use_profile:
        before = yaml.safe_load(Path(args.use_profile).read_text())
        path = Path(args.use_profile)
    else:
        before = calibrate(om, quick=args.quick, context=context, routing=routing)
        path = write_profile(before, args.profile, force=True)   # a benchmark run recalibrates
    cal_s = time.time() - t0
    # rounds over all points (a slow spell of the machine falls on one round of several points,
    # not on every run of one point); each point keeps its best round
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {pt: [] for pt in points}
    with cpus_awake(on_cpu):
        for _ in range(args.repeats):
            for pt in points:
                runs[pt].append(execute(scenarios[pt], om, path, trace))
    prof = before
    if not args.use_profile:
        after = calibrate(om, quick=args.quick, context=context, routing=routing)
        steps = [c["measurements"]["executor_step_s"] for c in (before, after)]
        prof = before if steps[0] <= steps[1] else after
        path = write_profile(prof, args.profile, force=True)
        write_profile(after if prof is before else before, Path(args.profile).with_suffix(".other.yaml"), force=True)
    hw, rt = prof["hardware"], prof["runtime"]
    where = "CPU" if on_cpu else prof["provenance"]["device"]
    print(f"# Simulator vs executor on {where}\n\ncommand: `python benchmarks/{Path(__file__).name} {' '.join(argv or sys.argv[1:])}`  ")
    threads = f"{prof['provenance']['torch_threads']} thread(s), " if on_cpu else ""
    print(f"device: {prof['provenance']['device']}, torch {prof['provenance']['torch']}, "
          f"{threads}{prof['provenance']['date']}  ")
    weights = om.source.get("weights", om.source.get("model", "?"))
    print(f"model: {om.spec.name} ({weights}), Mixtral architecture, {om.spec.num_layers} layers x {om.spec.num_experts} experts, top-{om.spec.top_k}, "
          f"hidden {om.hidden}, intermediate {om.inter}, {str(om.dtype).replace('torch.', '')} "
          f"({om.spec.expert_bytes / 1e6:.1f} MB per expert)  ")
    if args.use_profile:
        print(f"executor: {args.repeats} rounds over the {len(points)} points, each point's best round; simulated "
              f"with the profile {args.use_profile} (command: `{prof['provenance']['command']}`)  ")
    else:
        print(f"executor: {args.repeats} rounds over the {len(points)} points, each point's best round; calibrated "
              f"before and after them ({cal_s:.0f} s each), resident executor step {steps[0] * 1e3:.3f} / "
              f"{steps[1] * 1e3:.3f} ms: the {'first' if prof is before else 'second'} calibration is used  ")
    c = hw["costs"]
    print(f"calibrated: copies {hw['pcie_gbps']:.2f} GB/s + {hw['pcie_latency_us']:.0f} us; "
          f"expert {c['expert_us']:.0f} us; layer {c['layer_us']:.0f} us; head {c['head_us']:.0f} us; "
          f"overhead {rt['layer_us']:.0f} us/layer + {rt['iteration_us']:.0f} us/iteration; "
          f"{rt['demand_load_us']:.0f} us per demand load; {rt.get('prefetch_issue_us', 0.0):.0f} us per prefetch issued\n")
    print("| policy | rate | hit sim | hit real | TPOT p50 sim | real | err | TPOT mean sim | real | err | TTFT sim | real | err | H2D GB sim | real |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    from moesim.policies.contract.registry import make_policy

    p50_errs = []
    cpu_runs: list[str] = []   # experts run on the host CPU, simulated / executed
    # hit-rate agreement per kind of policy: (runs identical, runs, largest difference)
    agree = {kind: [0, 0, 0.0] for kind in ("demand-only", "prefetching")}
    prefetchers = sorted({pol for pol, _ in points if not make_policy(pol).demand_only()})
    for pol, rate in points:
        loaded = scenarios[(pol, rate)]
        real = best_of_runs(runs[(pol, rate)])
        sim = simulate(loaded, om.spec, path, trace)
        rows = {r["key"]: r for r in compare(sim, real)}
        h, p50, mean, ttft, gb = (rows[k] for k in ("hit_rate", "tpot_ms.p50", "tpot_ms.mean", "ttft_ms.mean", "h2d_gb"))
        tally = agree["prefetching" if pol in prefetchers else "demand-only"]
        tally[0] += sum(x == h["predicted"] for x in real["hit_rate_runs"])
        tally[1] += len(real["hit_rate_runs"])
        tally[2] = max([tally[2], *(abs(x - h["predicted"]) for x in real["hit_rate_runs"])])
        p50_errs.append(abs(p50["error_pct"]))
        if sim.get("cpu_expert_runs") or real.get("cpu_expert_runs"):
            cpu_runs.append(f"{pol} {rate:g}: {sim.get('cpu_expert_runs', 0)} / {real.get('cpu_expert_runs', 0)}")
        print(f"| {pol} | {rate:g} | {h['predicted']:.4f} | {h['measured']:.4f} | {p50['predicted']:.2f} | "
              f"{p50['measured']:.2f} | {p50['error_pct']:+.1f}% | {mean['predicted']:.2f} | {mean['measured']:.2f} | "
              f"{mean['error_pct']:+.1f}% | {ttft['predicted']:.2f} | {ttft['measured']:.2f} | {ttft['error_pct']:+.1f}% | "
              f"{gb['predicted']:.3f} | {gb['measured']:.3f} |", flush=True)
    if cpu_runs:
        print(f"\nexperts run on the host CPU (simulated / executed): {'; '.join(cpu_runs)}  ")
    same, total, worst = agree["demand-only"]
    if total:
        print(f"\nhit rates identical, demand-only policies: {'yes' if same == total else 'NO'} "
              f"({same} of {total} executor runs)  ")
    same, total, worst = agree["prefetching"]
    if total:
        print(f"hit rates identical, prefetching policies ({', '.join(prefetchers)}): {same} of {total} executor "
              f"runs; largest difference {worst:.4f} (an access whose prefetch lands a moment later on the "
              "executor counts as late there, as a hit in the simulator)  ")
    print(f"TPOT p50 |error|: median {statistics.median(p50_errs):.1f}%, max {max(p50_errs):.1f}% "
          f"over {len(p50_errs)} points (goal: median <= 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
