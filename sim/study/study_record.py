"""``study.json``: what a sweep or comparison folder holds and the commands that made it.

Every call of :func:`moesim.sim.study.sweep_run.run_sweep` records, in its output folder, the
study's name and source, the config hashes of its points (what makes two studies the same),
the workloads and seeds its points replay, and the command line with its working folder, time,
moesim version and source revision (appended: a resumed study lists each call). ``simctl
report`` prints the commands; :func:`default_out` reads the marker (its study key) so that a
default output folder is never overwritten by another study.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moesim.sim.core.atomic import atomic_file

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.study.sweep import Sweep

STUDY = "study.json"


def read_study(folder: str | Path) -> dict[str, Any]:
    """The folder's ``study.json`` (an empty mapping when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(folder) / STUDY).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def moesim_version() -> str:
    """The installed moesim version (``unknown`` when running from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moesim")
    except PackageNotFoundError:
        return "unknown"


def source_revision() -> str:
    """The source moesim runs from: ``git describe --always --dirty`` of its checkout when it
    runs from one (and git is there), else ``moesim <version>`` of the installed package."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
                                  capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            return f"git {done.stdout.strip()}"
    return f"moesim {moesim_version()}"


def workloads(sweep: Sweep) -> list[dict[str, Any]]:
    """The distinct workloads the points replay (batch size, phases, requests, and the profile
    split taken off the front of the trace), in point order."""
    from moesim.sim.config.sections import WorkloadSpec

    out: list[dict[str, Any]] = []
    for p in sweep.points:
        w = WorkloadSpec.model_validate(p.data.get("workload") or {}).model_dump(mode="json")
        w["profile"] = p.data.get("profile")
        if w not in out:
            out.append(w)
    return out


def record_study(out: Path, sweep: Sweep, command: list[str] | None = None) -> None:
    """Write ``out/study.json``: the study, its workloads and seeds and, appended to those
    already there, this command."""
    previous = read_study(out)
    argv = list(command) if command is not None else ["simctl", *sys.argv[1:]]
    entry = {"argv": argv, "command": shlex.join(argv), "cwd": os.getcwd(),
             "at": time.strftime("%Y-%m-%d %H:%M:%S %z"), "moesim_version": moesim_version(),
             "revision": source_revision()}
    commands = [c for c in previous.get("commands", []) if isinstance(c, dict)] + [entry]
    data = {"name": sweep.spec.name, "source": sweep.source, "points": [p.config_hash for p in sweep.points],
            "workloads": workloads(sweep), "seeds": sorted({int(p.data.get("seed", 0)) for p in sweep.points}),
            "commands": commands}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / STUDY, option="--out", force=True) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")


def default_out(sweep: Sweep, root: Path = Path("runs"), now: float | None = None) -> tuple[Path, str | None]:
    """The default output folder of a study: ``runs/<name>`` when it is free or holds this very
    study (its marker has the same study key: it is resumed), else ``runs/<name>-<YYYYmmdd-HHMMSS>``, so that another
    study's results are never overwritten. Returns the folder and a note saying why it moved
    (None when it did not)."""
    first = root / sweep.spec.name
    if not first.exists() or (first.is_dir() and not any(first.iterdir())):
        return first, None
    from moesim.sim.core.ownership import read_marker
    from moesim.sim.study.study_folder import same_study

    if same_study(first, sweep):
        return first, None
    held = read_study(first).get("points") if read_marker(first) is not None else None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    out = root / f"{sweep.spec.name}-{stamp}"
    n = 2
    while out.exists():
        out = root / f"{sweep.spec.name}-{stamp}-{n}"
        n += 1
    why = "another study" if held is not None else "other files"
    return out, f"{first} holds {why}; writing {out} instead (give --out to choose)"
