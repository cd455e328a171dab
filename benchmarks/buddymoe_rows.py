"""Why moesim ranks BuddyMoE's rows as it does (issue 32): every row of
``measurements/buddymoe-tables2-4.yaml`` re-run at the committed fit's values, with what the
buddy planner did (misses swapped, misses with no resident buddy, swaps cut by rho), as the set
reads the tables and under two other readings, each at the same fitted values (not refitted).

    python benchmarks/buddymoe_rows.py --out benchmarks/results/buddymoe_rows.md   # ~1 min

Readings: ``set`` is the set as committed (the tables' tau is the CFT alpha, spec sheet A1; the
base is ``mixtral-offloading``: per-layer LRU pools and lookahead prefetch of layer l + 1, A5);
``tae``: the tables' tau is the TAE gate's threshold, alpha 1 capped at |B| (A1's other
reading); ``no prefetch``: every row on ``lru`` (Original = lru, Random and BuddyMoE on an lru
base), the base with no prefetch. The figures are simulated (same seed, same numbers on any
machine). The tables' own noise floor is printed beside them: pairs of BuddyMoE rows whose
published order no cap on swaps can give while a swap costs less than the load it saves.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

STEM = "buddymoe-tables2-4"
"""The measurement set (and fit folder) read."""

READINGS = ("set", "tae", "no prefetch")
"""The readings run, in column order (see the module docstring)."""


def _policy_for(reading: str, policy: Any) -> Any:
    """A row's policy under ``reading``."""
    if reading == "set":
        return policy
    if reading == "no prefetch":
        if isinstance(policy, dict):
            return {**policy, "params": {**policy["params"], "base": "lru"}}
        return "lru"
    if isinstance(policy, dict) and policy["name"] == "buddymoe":   # tae
        params = dict(policy["params"])
        params["tau"] = params.pop("alpha")
        params["alpha"] = 1.0
        return {**policy, "params": params}
    return policy


def run_rows(reading: str) -> list[dict[str, Any]]:
    """Each row's tokens/s and planner counts under ``reading``, at the committed fitted values."""
    import seed_scoreboard as sb

    from moesim.sim.config.scenario import load_scenario_data, set_key
    from moesim.sim.run.runner import load_trace, run_loaded
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(sb.MEASUREMENTS / f"{STEM}.yaml")
    out = []
    for row in sb.load_rows(STEM):
        spec = ms.rows[row.index]
        values = sb.fitted_values(STEM, row)
        data = copy.deepcopy(spec.data)
        data["policy"] = _policy_for(reading, data["policy"])
        for key, value in values:
            set_key(data, key.split("."), value, f"{STEM}: {key}")
        loaded = load_scenario_data(data, source=f"{STEM} row {row.index}", base_dir=ms.base_dir,
                                    fixed=(*spec.set, *(k for k, _ in values)))
        m = run_loaded(loaded, steps=False, trace=load_trace(loaded)).metrics
        buddy = (m.get("policy_report") or {}).get("buddy") or {}
        out.append({"row": row, "tokens_per_s": float(m["tokens_per_s"]), "buddy": buddy,
                    "subs": float(m.get("substitutions_per_token") or 0.0)})
    return out


def _counts(b: dict[str, int]) -> str:
    if not b:
        return "-"
    misses = b["swaps"] + b["no_buddy"] + b["rho_cut"]
    per = misses / b["with_miss"] if b["with_miss"] else 0.0
    return (f"{b['swaps']} / {b['no_buddy']} / {b['rho_cut']} / {b['tae_blocked']} "
            f"({per:.2f} misses a token-layer)")


def noise_floor(rows: list[Any]) -> list[str]:
    """Published pairs of BuddyMoE rows on one cache rate where a row with a cap on swaps (rho)
    is faster than the same lists without one: more than a cap can give."""
    out = []
    for a in rows:
        for b in rows:
            pa, pb = a.set.get("policy"), b.set.get("policy")
            if not (isinstance(pa, dict) and isinstance(pb, dict) and pa["name"] == pb["name"] == "buddymoe"):
                continue
            if a.set.get("cache.rate") != b.set.get("cache.rate"):
                continue
            ka = {k: v for k, v in pa["params"].items() if k != "rho"}
            kb = {k: v for k, v in pb["params"].items() if k != "rho"}
            if ka == kb and "rho" in pa["params"] and "rho" not in pb["params"] and a.measured > b.measured:
                out.append(f"c = {a.set['cache.rate']}: rho = {pa['params']['rho']} at {a.measured} tokens/s beats "
                           f"the same lists without rho at {b.measured} (+{100 * (a.measured / b.measured - 1):.1f}%)")
    return out


def report() -> str:
    """The table as Markdown."""
    runs = {r: run_rows(r) for r in READINGS}
    lines = ["# BuddyMoE's rows at the fitted values, three readings", "",
             "Written by `python benchmarks/buddymoe_rows.py` from "
             f"`benchmarks/results/fits/{STEM}/` (no fitting; the readings are in the script's docstring). "
             "Planner: swaps / misses with no resident buddy / misses past rho / token-layers kept by the "
             "TAE gate, summed over the replayed decode.", "",
             "| row | role | policy | published t/s | set | tae | no prefetch | planner (set) | planner (no prefetch) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, base in enumerate(runs["set"]):
        row = base["row"]
        cells = " | ".join(f"{runs[r][i]['tokens_per_s']:.2f}" for r in READINGS)
        lines.append(f"| {row.index} | {row.role} | {row.policy} | {row.measured:g} | {cells} | "
                     f"{_counts(base['buddy'])} | {_counts(runs['no prefetch'][i]['buddy'])} |")
    rows = [x["row"] for x in runs["set"]]
    lines += ["", "Published orders no cap on swaps can give (the tables' own spread):", ""]
    lines += [f"- {t}" for t in noise_floor(rows)] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the report, and write it with ``--out``."""
    from results_file import report_main

    return report_main(report, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
