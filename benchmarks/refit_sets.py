"""Refit every shipped measurement set into ``benchmarks/results/fits/<set>`` with the options
it is committed with (one place for them), one set after another, each fit's progress on
stderr. The scoreboard (``seed_scoreboard.py``) and the catalog's fitted entries
(``sync_catalog_fits.py``) read these folders.

    python benchmarks/refit_sets.py                    # every set (about 40 min on 2 shared cores)
    python benchmarks/refit_sets.py moepic-qwen buddymoe-tables2-4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPTIONS: dict[str, list[str]] = {
    "eliseev-mazur-2023-table2": ["--loo", "none"],
    "eliseev-mazur-2023-table2-one-runtime": ["--loo", "none"],
    "eliseev-mazur-2023-table2-miss-cost": ["--loo", "none"],
    "buddymoe-tables2-4": ["--loo", "none"],
    "moepic-table1-hitrates": ["--loo", "none"],
    "commitmoe-fig5": ["--loo", "none"],
    "moepic-qwen": ["--loo", "none"],
    "moepic-mixtral": ["--loo", "none"],
    "activeevict-table3-mixtral": ["--loo", "none", "--grid", "3", "--max-evals", "12"],
    "activeevict-table3-llama": ["--loo", "none", "--grid", "6", "--max-evals", "12"],
    "fmoe-end-to-end": ["--loo", "none"],
    "moepic-a6000-joint": ["--grid", "3", "--max-evals", "20", "--loo", "none"],
    "ktransformers-deepseek-v3": ["--loo", "none", "--grid", "3", "--max-evals", "15"],
    "llmfit-rtx2080-llamacpp-moe": ["--loo", "none"],
    "ktransformers-epyc9654-deepseek-r1": ["--loo", "none"],
    "ktransformers-v021-deepseek-v3-context": ["--loo", "none", "--grid", "3", "--max-evals", "15"],
    "fiddler-repo-baselines": ["--loo", "none"],
    "imp-qwen3-30b-budget": ["--loo", "none", "--grid", "2", "--max-evals", "8"],
    "ktransformers-sosp25-decode": ["--loo", "none"],
    "llamacpp-epyc9374f-deepseek-v32": ["--loo", "none"],
    "llamacpp-rtx4080-7950x-qwen3-30b": ["--loo", "none"],
}
"""Each committed set and the ``simctl fit`` options of its committed fit."""


def main() -> None:
    """Run the fits named (default: all) and print each one's wall time."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sets", nargs="*", help="set stems (default: all of OPTIONS)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes per fit (results do not depend on it)")
    args = ap.parse_args()
    unknown = [s for s in args.sets if s not in OPTIONS]
    if unknown:
        sys.exit(f"refit_sets: unknown set {unknown[0]} (known: {', '.join(OPTIONS)})")
    for stem in args.sets or list(OPTIONS):
        cmd = ["simctl", "fit", f"measurements/{stem}.yaml", "--out", f"benchmarks/results/fits/{stem}",
               *OPTIONS[stem], "--force", "--no-progress"]
        if args.jobs > 1:
            cmd += ["--jobs", str(args.jobs)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, check=False)
        print(f"{stem}: exit {done.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
