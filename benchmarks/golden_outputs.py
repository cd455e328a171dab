"""Golden outputs: every shipped scenario x every registered policy (and each scenario's own
policy), each run's ``metrics.json`` and step records hashed into one JSON file, so that two
trees can be compared run by run (a file move, a refactor of the engine: "bit for bit").

    python benchmarks/golden_outputs.py OUT.json [ROOT]       # ROOT: the tree whose scenarios run
    python benchmarks/golden_outputs.py --compare A.json B.json

Environment: ``GOLDEN_SCEN=substring`` limits the scenarios, ``GOLDEN_POLICIES=a,b`` the
policies (each scenario's own policy runs either way). To hash another checkout's code,
put a folder with ``moesim/{sim,policies,traces}`` links to it first on ``PYTHONPATH``. A run
that fails records its one-line error (``ERR:``) or exception (``EXC:``: a bug) instead of a
hash. The shipped plugins run (the script sets ``MOESIM_ALLOW_PLUGINS=1``); a plugin run's
hash covers its ``plugins`` field (each file relative to ROOT, with its sha256). About 1,000 runs: several minutes on two cores.

``engine_path`` and ``engine_path_reason`` are left out of the hash: they say how a run was
computed (a fast replay or the event loop, and why), not what it computed, and a run that a
fast replay takes over must hash the same as before.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HOW = ("engine_path", "engine_path_reason", "cache_start")
"""Metrics not hashed: which path computed a run, and ``cache_start`` (``cold``/``warm``, a
restatement of the scenario's ``cache.initial``, whose effect the hashed outputs carry; added
after the baselines were made, so that they stay comparable)."""


def run_digest(metrics: dict[str, Any], steps: dict[str, np.ndarray], root: Path) -> str:
    """The sha256 of a run's metrics (less :data:`HOW`) and step records (every column's name,
    dtype and bytes, columns in name order): equal digests, equal outputs. Plugin files are
    named relative to ``root`` (the tree whose scenarios ran), so that two trees compare."""
    metrics = {k: v for k, v in metrics.items() if k not in HOW}
    if "plugins" in metrics:
        metrics["plugins"] = [{**p, "file": os.path.relpath(p["file"], root)} for p in metrics["plugins"]]
    h = hashlib.sha256(json.dumps(metrics, sort_keys=True, default=str).encode())
    for col in sorted(steps):
        a = np.ascontiguousarray(steps[col])
        h.update(col.encode())
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def golden(root: Path, only: str | None = None, policies: list[str] | None = None) -> dict[str, str]:
    """Hash of every (scenario, policy) run under ``root``'s ``scenarios/`` (sweeps excluded),
    or of the ``policies`` named."""
    from moesim.policies.contract.registry import policy_names
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.core.errors import MoesimError
    from moesim.sim.run.runner import run_loaded

    warnings.filterwarnings("ignore")
    # the shipped scenarios' plugins (scenarios/plugins/) are this tree's own code: allowed
    # explicitly, as a script allows them (MOESIM_ALLOW_PLUGINS=1)
    os.environ["MOESIM_ALLOW_PLUGINS"] = "1"
    out: dict[str, str] = {}
    scenarios = sorted(p for p in glob.glob(f"{root}/scenarios/**/*.yaml", recursive=True) if "/sweeps/" not in p)
    for scen in scenarios:
        if only and only not in scen:
            continue
        for name in ["<own>", *sorted(policies or policy_names())]:
            key = f"{os.path.relpath(scen, root)}::{name}"
            try:
                res = run_loaded(load_scenario(scen, [] if name == "<own>" else [f"policy={name}"]))
            except MoesimError as exc:
                out[key] = "ERR:" + str(exc).replace(str(root), "ROOT")[:200]
                continue
            except Exception as exc:  # a bug: recorded, so that the comparison shows it
                out[key] = f"EXC:{type(exc).__name__}: {exc}"[:200]
                continue
            out[key] = run_digest(res.metrics, res.steps, root)
            print(key, out[key][:12], flush=True)
    return out


def compare(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The keys whose entries differ (or that only one side has)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def main() -> int:
    """Write the golden file, or compare two."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="OUT.json [ROOT], or with --compare: A.json B.json")
    ap.add_argument("--compare", action="store_true", help="compare two golden files")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.paths[:2])
        diff = compare(a, b)
        for k in diff:
            print(f"{k}: {a.get(k, 'missing')[:40]} | {b.get(k, 'missing')[:40]}")
        print(f"{len(set(a) | set(b)) - len(diff)} equal, {len(diff)} differ")
        return 1 if diff else 0
    root = Path(args.paths[1] if len(args.paths) > 1 else ".").resolve()
    from results_file import write_result

    write_result(Path(args.paths[0]), json.dumps(golden(root, os.environ.get("GOLDEN_SCEN"),
                                                     [p for p in os.environ.get("GOLDEN_POLICIES", "").split(",") if p]), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
