"""The golden table that CI checks (``tests/test_golden_ci.py``): a subset of
:mod:`benchmarks.golden_outputs`' runs (every shipped scenario x every policy) that still
reaches every shipped scenario, every registered policy, every engine path (each fast kernel,
the generic fast replay, the prefetch replay, the event loop) and each engine option on each
path that took it (lossy plans, ``swap_out``, the transfer buffer, fifo order, synchronous
prefetch, one global pool, batches, a runtime, a profile split, oracles), each run hashed as
``golden_outputs.py`` hashes it (``engine_path`` and its reason left out of the hash).

    python benchmarks/golden_ci.py            # re-hash the table's runs with this tree (after an intended change)
    python benchmarks/golden_ci.py --select   # run every scenario x policy (~10 min), pick the cheapest
                                              # covering subset again, hash it (after adding scenarios or policies)
    python benchmarks/golden_ci.py --check    # what the test does: exit 1 naming the runs that differ

The table is ``tests/data/golden_ci.json``: per run its digest, and for reading only the engine
path it took, its policy, the coverage keys it was chosen for and its seconds (the test compares
digests).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.golden_outputs import compare, run_digest  # noqa: E402

TABLE = ROOT / "tests" / "data" / "golden_ci.json"
"""The committed table."""

OWN = "<own>"
"""The policy name of a run with the scenario's own policy (as in ``golden_outputs.py``)."""

REGENERATE = "python benchmarks/golden_ci.py"
"""The command that re-hashes the table after an intended change of outputs."""


def scenario_files(root: Path = ROOT) -> list[str]:
    """Every shipped scenario (sweeps excluded), relative to ``root``."""
    return sorted(os.path.relpath(p, root) for p in glob.glob(f"{root}/scenarios/**/*.yaml", recursive=True)
                  if "/sweeps/" not in p)


BASE = "scenarios/tiny-moe-prefetch.yaml"
"""The scenario every policy runs on (besides each scenario's own run), trimmed by :data:`TRIM`."""

TRIM = ("workload.requests=4",)
"""Overrides that keep :data:`BASE`'s runs short."""

DECODE = "workload.phases=[decode]"   # one token per iteration: pools that hold a layer's experts

EVENT = "engine=event"
"""A pseudo-override (not passed to the scenario): the run is forced onto the SimPy event loop,
the reference, which no shipped run takes on its own (the fast path takes every run whose
options it declares); its digest must equal the same run's on the fast path."""

OPTIONS = ((), ("pcie.order=fifo",), ("cache.swap_out=true",), ("cache.buffer_experts=2",),
           ("pcie.sync_prefetch=true",), ("workload.batch_size=3",), ("cache.scope=global",),
           (DECODE,), (DECODE, "cache.initial=popular"), (DECODE, "pcie.order=fifo"), (DECODE, "cache.scope=global"),
           (DECODE, "cache.rate=0.5", "workload.batch_size=3"),
           (EVENT,), ("pcie.order=fifo", EVENT), ("cache.swap_out=true", EVENT), ("cache.buffer_experts=2", EVENT),
           ("pcie.sync_prefetch=true", EVENT), ("workload.batch_size=3", EVENT), ("cache.scope=global", EVENT))
"""The engine options each policy may run with on :data:`BASE` (no shipped scenario uses fifo
order, for one); decode-only runs reach the cache kernels (a prefill's many tokens need more
room than a pool of the trimmed scenario holds); :data:`EVENT` runs reach the event loop."""


def split_key(key: str) -> tuple[str, str, list[str]]:
    """``scenarios/x.yaml::policy`` or ``scenarios/x.yaml::policy::k=v,k=v`` -> (scenario,
    policy, ``--set`` overrides)."""
    scen, name, *rest = key.split("::")
    return scen, name, [o for o in (rest[0] if rest else "").split(",") if o]


class _EventLoop:
    """A fast replay that refuses every run (:data:`EVENT`)."""

    def refusal(self, run: Any) -> str:
        """Every run goes to the event loop."""
        return "forced onto the event loop (golden CI)"

    def run(self, run: Any) -> None:
        """Never called."""
        raise AssertionError("the event loop was forced")


def run_one(key: str, root: Path = ROOT) -> tuple[str, dict[str, Any] | None]:
    """Run ``key`` (see :func:`split_key`) under ``root``: its digest (``ERR:``/``EXC:`` and the
    message for a run that fails) and its metrics and config (None when it failed)."""
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.core.errors import MoesimError
    from moesim.sim.run import runner
    from moesim.sim.run.runner import run_loaded

    os.environ.setdefault("MOESIM_ALLOW_PLUGINS", "1")   # scenarios/plugin-example.yaml loads a plugin
    scen, name, sets = split_key(key)
    fast = runner.FAST_PATH
    if EVENT in sets:
        sets = [o for o in sets if o != EVENT]
        runner.FAST_PATH = _EventLoop()   # type: ignore[assignment]
    try:
        res = run_loaded(load_scenario(str(root / scen), sets + ([] if name == OWN else [f"policy={name}"])))
    except MoesimError as exc:
        return "ERR:" + str(exc).replace(str(root), "ROOT")[:200], None
    except Exception as exc:  # a bug: recorded, so that the comparison shows it
        return f"EXC:{type(exc).__name__}: {exc}"[:200], None
    finally:
        runner.FAST_PATH = fast
    return run_digest(res.metrics, res.steps, root), {"metrics": res.metrics, "config": res.config}


def coverage(scen: str, info: dict[str, Any]) -> set[str]:
    """The coverage keys one successful run reaches: its scenario, its policy, its engine path,
    and its engine path with each option it ran with."""
    m, c = info["metrics"], info["config"]
    cache, pcie, wl = c.get("cache", {}), c.get("pcie", {}), c.get("workload", {})
    res = c.get("resolved", {})
    path = str(m.get("engine_path"))
    options = {
        "lossy": "routing_mass_kept" in m,   # reported for lossy policies only
        "oracle": bool(res.get("policy", {}).get("bound")),
        "swap_out": bool(cache.get("swap_out")),
        "buffer": bool(res.get("buffer_bytes")),
        "fifo": pcie.get("order") == "fifo",
        "sync_prefetch": bool(pcie.get("sync_prefetch")),
        "global_pool": cache.get("scope") == "global",
        "batch": int(wl.get("batch_size", 1)) > 1,
        "runtime": c.get("runtime", "none") != "none",
        "profile": bool(c.get("profile")),
    }
    keys = {f"scenario:{scen}", f"policy:{res.get('policy', {}).get('name', c.get('policy'))}", f"path:{path}"}
    keys |= {f"path:{path}+{opt}" for opt, on in options.items() if on}
    return keys


def candidates(root: Path = ROOT) -> list[str]:
    """The runs :func:`select` chooses from: each shipped scenario as it is, and every
    registered policy on :data:`BASE` with each of :data:`OPTIONS`."""
    from moesim.policies.contract.registry import policy_names

    out = [f"{scen}::{OWN}" for scen in scenario_files(root)]
    for name in policy_names():
        out += [f"{BASE}::{name}::{','.join((*TRIM, *opts))}" for opts in OPTIONS]
    return out


def select(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Run every :func:`candidates` run, then choose greedily, by keys newly covered per
    second, runs until every coverage key of a successful run is covered (each scenario's own
    run is always chosen: only it covers the scenario as shipped)."""
    warnings.filterwarnings("ignore")
    cand: dict[str, tuple[str, set[str], float, str, str]] = {}
    for key in candidates(root):
        t0 = time.perf_counter()
        digest, info = run_one(key, root)
        secs = time.perf_counter() - t0
        if info is None:
            continue
        cand[key] = (digest, coverage(split_key(key)[0], info), secs, str(info["metrics"].get("engine_path")),
                     str(info["metrics"].get("policy")))
        print(f"{secs:6.2f}s {key} {cand[key][3]}", flush=True)
    left = set().union(*(c[1] for c in cand.values()))
    chosen: dict[str, dict[str, Any]] = {}
    for key in [k for k in cand if split_key(k)[1] == OWN]:
        digest, keys, secs, path, policy = cand.pop(key)
        chosen[key] = {"digest": digest, "engine_path": path, "policy": policy, "covers": sorted(keys & left),
                       "seconds": round(secs, 3)}
        left -= keys
    while left:
        key = max(cand, key=lambda k: (len(cand[k][1] & left) / max(cand[k][2], 0.01), k))
        digest, keys, secs, path, policy = cand.pop(key)
        chosen[key] = {"digest": digest, "engine_path": path, "policy": policy, "covers": sorted(keys & left),
                       "seconds": round(secs, 3)}
        left -= keys
    return dict(sorted(chosen.items()))


def rehash(runs: dict[str, dict[str, Any]], root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """The same runs with this tree's digests and engine paths."""
    warnings.filterwarnings("ignore")
    out = {}
    for key, row in runs.items():
        t0 = time.perf_counter()
        digest, info = run_one(key, root)
        path = str(info["metrics"].get("engine_path")) if info else ""
        policy = str(info["metrics"].get("policy")) if info else ""
        out[key] = {**row, "digest": digest, "engine_path": path, "policy": policy,
                    "seconds": round(time.perf_counter() - t0, 3)}
    return out


def load_table(path: Path = TABLE) -> dict[str, dict[str, Any]]:
    """The committed table's runs."""
    return dict(json.loads(path.read_text())["runs"])


def differences(table: dict[str, dict[str, Any]], root: Path = ROOT) -> list[str]:
    """One line per run of ``table`` whose digest this tree does not reproduce."""
    now = {key: run_one(key, root)[0] for key in table}
    return [f"{key}: table {table[key]['digest'][:12]}, now {now[key][:60]}"
            for key in compare({k: r["digest"] for k, r in table.items()}, now)]


def write_table(runs: dict[str, dict[str, Any]], path: Path = TABLE) -> None:
    """Write ``runs`` with the note that says what the table is."""
    doc = {"note": f"golden digests checked by tests/test_golden_ci.py; regenerate: {REGENERATE}",
           "runs": runs}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main() -> int:
    """Re-hash, re-select or check the table."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--select", action="store_true", help="run every scenario x policy and choose the runs again")
    ap.add_argument("--check", action="store_true", help="compare this tree with the table; exit 1 if a run differs")
    args = ap.parse_args()
    if args.check:
        diff = differences(load_table())
        print("\n".join(diff) or "golden table reproduced")
        return 1 if diff else 0
    runs = select() if args.select else rehash(load_table())
    write_table(runs)
    print(f"{TABLE.relative_to(ROOT)}: {len(runs)} runs, {sum(r['seconds'] for r in runs.values()):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
