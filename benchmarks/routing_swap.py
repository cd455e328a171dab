"""How much a measurement set's predictions move when its synthetic trace's routing changes
(issue 32 item 4): every row of the set run at its committed fitted values
(``benchmarks/results/fits/<set>/fitted.yaml``), once on the trace the file states and once with
``trace.synthetic`` changed as asked, side by side with the relative difference. The question it
answers is whether a set's timing depends on routing at all (every expert resident: it should
not), before the set is moved to a fitted preset and refitted.

    python benchmarks/routing_swap.py measurements/tenstorrent-qwen3-30b-a3b-a100-context.yaml \\
        --set preset=qwen3-30b-a3b --drop num_layers,num_experts,top_k
    python benchmarks/routing_swap.py measurements/X.yaml --fit benchmarks/results/fits/X --set ...

``--set KEY=VALUE`` sets ``trace.synthetic.KEY`` (a YAML value) in every row after the row's own
keys; ``--drop KEY,...`` removes base keys first (shape overrides a preset already fixes). The
fitted values are those of ``--fit`` (default: the set's committed fit folder).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fitted_values(fit: Path) -> tuple[tuple[str, float], ...]:
    """The fit's values (``parameters`` of its ``fitted.yaml``); per-group values are refused."""
    doc = yaml.safe_load((fit / "fitted.yaml").read_text())
    params = doc.get("parameters") or []
    if any(p.get("per") is not None for p in params):
        raise SystemExit(f"routing_swap: {fit}/fitted.yaml has per-group values, which this script does not apply")
    return tuple((str(p["key"]), float(p["value"])) for p in params)


def swapped(data: dict[str, Any], sets: dict[str, Any], drops: list[str]) -> dict[str, Any]:
    """``data`` with its ``trace.synthetic`` keys ``drops`` removed and ``sets`` applied."""
    out = copy.deepcopy(data)
    synth = out["trace"]["synthetic"]
    for key in drops:
        synth.pop(key, None)
    synth.update(sets)
    return out


def report(path: Path, fit: Path, sets: dict[str, Any], drops: list[str]) -> str:
    """A Markdown table of every row's prediction on both traces."""
    from moesim.sim.study.fit_runs import row_jobs, run_job
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(path)
    values = fitted_values(fit)
    change = ", ".join([f"drop {k}" for k in drops] + [f"{k}: {v}" for k, v in sets.items()])
    shown = fit.resolve().relative_to(ROOT) if fit.resolve().is_relative_to(ROOT) else fit
    lines = [f"# {path.name}: routing swap at the fitted values of {shown}", "",
             f"Trace change: {change}. Fitted values: "
             + ", ".join(f"{k} = {v:.6g}" for k, v in values) + ".", "",
             "| row | role | metric | measured | as the file | swapped | swapped / as the file - 1 |",
             "|---|---|---|---:|---:|---:|---:|"]
    for job, row in zip(row_jobs(ms), ms.rows, strict=True):
        if job.more or job.reference is not None:
            raise SystemExit(f"routing_swap: {row.where} is a mean or ratio row, which this script does not run")
        alt = type(job)(job.index, swapped(job.data, sets, drops), job.source, job.base_dir, job.fixed, job.metrics)
        a, b = run_job(job, values), run_job(alt, values)
        if a.error or b.error:
            raise SystemExit(f"routing_swap: {row.where}: {a.error or b.error}")
        for name, measured in row.measured.items():
            x, y = a.values[name], b.values[name]
            diff = "n/a" if not x or y is None else f"{(y / x - 1) * 100:+.3f}%"
            lines.append(f"| {row.where} | {row.role} | {name} | {measured:g} | {x:.6g} | {y:.6g} | {diff} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--out`` also writes it (:func:`results_file.write_result`)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import write_result

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measurements", type=Path)
    ap.add_argument("--fit", type=Path, help="fit folder (default benchmarks/results/fits/<set stem>)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="trace.synthetic key to set")
    ap.add_argument("--drop", default="", help="comma-separated trace.synthetic keys to remove first")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args(argv)
    sets = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        sets[key] = yaml.safe_load(value)
    fit = args.fit or ROOT / "benchmarks" / "results" / "fits" / args.measurements.stem
    text = report(args.measurements, fit, sets, [k for k in args.drop.split(",") if k])
    print(text)
    if args.out:
        write_result(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
