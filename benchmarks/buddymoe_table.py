"""BuddyMoE's Tables 2-4 (DeepSeek-V2-Lite on an A100, cache rates 0.75 / 0.50 / 0.375) next to
the simulator's: tokens/s of Original (mixtral-offloading), Random (random-substitute on the
same base) and BuddyMoE rows (tau = CFT alpha, |B| = K_max, rho), with the quality side that a
trace can measure (hit rate, routing mass kept, substitutions per token, effective top-k, top-1
agreement) and the PCIe traffic of Fig. 8.

    python benchmarks/buddymoe_table.py                  # ~4 min on 2 busy cores
    python benchmarks/buddymoe_table.py --rates 0.375 --miss load   # the headline table only
    python benchmarks/buddymoe_table.py --reading tae    # the tables' tau as the TAE threshold

Setup: scenarios/buddymoe/deepseek-a100-buddymoe.yaml (synthetic DeepSeek-V2-Lite routing, the
first half of the requests as the profiling split, the rest replayed decode-only at batch 1,
llama.cpp-like costs: see the scenario's comments for where each number comes from). The
paper's ARC-E / ARC-C accuracies need the real checkpoint and a quality harness: moesim replays
recorded routing, so it cannot reproduce them; routing mass kept and top-1 agreement are the
trace-level proxies printed beside them.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper_runs import run_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios" / "buddymoe" / "deepseek-a100-buddymoe.yaml"

# Tables 2-4: rows (method, tau, |B|, rho) -> (Avg of ARC-E/ARC-C, tokens/s); None = "-" / blank
PAPER: dict[float, list[tuple[str, float | None, int | None, int | None, float | None, float | None]]] = {
    0.75: [("Original", None, None, None, 0.735, 34.23), ("Random", None, None, None, 0.55, 39.67),
           ("BuddyMoE", 0.75, 4, None, 0.64, 37.42), ("BuddyMoE", 0.95, 16, None, 0.525, 37.12),
           ("BuddyMoE", 0.95, 16, 3, 0.695, 36.75), ("BuddyMoE", 0.95, 16, 4, 0.54, 38.50)],
    0.5: [("Original", None, None, None, None, 28.56), ("Random", None, None, None, 0.23, 33.14),
          ("BuddyMoE", 0.99, 2, None, 0.53, 28.95), ("BuddyMoE", 0.95, 16, None, 0.30, 31.87),
          ("BuddyMoE", 0.95, 16, 3, 0.635, 30.21), ("BuddyMoE", 0.95, 16, 4, 0.55, 31.02)],
    0.375: [("Original", None, None, None, None, 24.78), ("Random", None, None, None, 0.16, None),
            ("BuddyMoE", 0.95, 16, None, 0.175, 30.22), ("BuddyMoE", 0.95, 16, 3, 0.645, 27.33),
            ("BuddyMoE", 0.95, 16, 4, 0.51, 27.46)],
}
HEADLINE = (0.375, 0.95, 16, 3)     # +10.3% tokens/s over Original (section 5.2)
TABLE_NO = {0.75: 2, 0.5: 3, 0.375: 4}


def scenario(rate: float, method: str, tau: float | None, size: int | None, rho: int | None,
             reading: str = "cft", miss: str = "load") -> dict[str, Any]:
    """The scenario file with cache rate ``rate`` and the row's policy. ``reading`` ``cft``:
    the table's tau is BuddyMoE's alpha (spec A1, recommended); ``tae``: it is the TAE gate's
    threshold, with alpha = 1 and the list capped at |B| (the sensitivity reading). ``miss``
    ``load``: a miss is a host-to-device load (spec A4, recommended); ``cpu``: llama.cpp's native
    offloading, c * E most popular experts per layer pinned on the GPU (``static``) and every miss computed on the host CPU (Original = buddymoe with rho = 0)."""
    data = copy.deepcopy(yaml.safe_load(SCENARIO.read_text()))
    data["cache"]["rate"] = rate
    base = data["policy"]["params"]["base"]
    base_params: dict[str, Any] | None = None
    extra: dict[str, Any] = {}
    if miss == "cpu":
        base, base_params, extra = "static", {"staging_experts": 0}, {"fallback": "cpu"}
    if method == "Original":
        data["policy"] = base if miss == "load" else {"name": "buddymoe", "params": {
            "base": base, "base_params": base_params, "rho": 0, **extra}}
    elif method == "Random":
        data["policy"] = {"name": "random-substitute", "params": {"base": base, "base_params": base_params}}
    else:
        params: dict[str, Any] = {"base": base, "base_params": base_params, "k_max": size, "rho": rho, **extra}
        if reading == "cft":
            params["alpha"] = tau
        else:
            params.update(alpha=1.0, tau=tau)
        data["policy"] = {"name": "buddymoe", "params": params}
    data["name"] = f"buddymoe-{method}-{rate}"
    return data


def measure(data: dict[str, Any]) -> dict[str, Any]:
    """The row's metrics and the planner's counters."""
    m, pol = run_scenario(data)
    pl = getattr(pol, "planner", None)
    return {"tps": m["tokens_per_s"], "hit": m["hit_rate"], "mass": m.get("routing_mass_kept", 1.0),
            "subs": m.get("substitutions_per_token", 0.0), "topk": m.get("effective_top_k"),
            "top1": m.get("top1_agreement", 1.0), "h2d": m["h2d_gb_per_token"] * 1e3,
            "stall": m["stall_ms_per_token"], "warn": m["warnings"], "counts": getattr(pl, "counts", None)}


def _f(x: float | None, fmt: str) -> str:
    """``x`` formatted, or a dash of the same width."""
    pct = "%" if fmt.endswith("%") else ""
    if x is None:
        width = re.match(r"\+?(\d*)", fmt)
        return "-".rjust(int(width.group(1) or 0) + len(pct)) if width else "-"
    return format(x, fmt.rstrip("%")) + pct


PAPER_FULL_MS = 22.9   # ms per token at c = 1, extrapolated from the Original rows (spec sheet A6)


def table(rate: float, reading: str, miss: str) -> dict[tuple[str, float | None, int | None, int | None], dict[str, Any]]:
    """Print one table; returns the measured rows."""
    print(f"\n== Table {TABLE_NO[rate]}: DeepSeek-V2-Lite, cache rate {rate}"
          f" (table tau read as {'CFT alpha' if reading == 'cft' else 'TAE threshold, alpha = 1'}; "
          f"a miss {'loads over PCIe' if miss == 'load' else 'runs on the CPU'}) ==")
    print(f"{'method':9} {'tau':>5} {'|B|':>4} {'rho':>4} | {'paper Avg':>9} {'t/s':>6} {'dt/s':>7} | "
          f"{'sim t/s':>7} {'dt/s':>7} {'hit':>6} {'mass':>6} {'subs/tok':>8} {'top-k':>6} {'top1':>6} "
          f"{'MB/tok':>7} {'stall ms':>8}")
    rows = {}
    orig_paper = PAPER[rate][0][5]
    for method, tau, size, rho, avg, tps in PAPER[rate]:
        r = rows[(method, tau, size, rho)] = measure(scenario(rate, method, tau, size, rho, reading, miss))
        orig = rows[("Original", None, None, None)]["tps"]
        dp = None if tps is None or orig_paper is None else (tps / orig_paper - 1) * 100
        print(f"{method:9} {_f(tau, '5.2f')} {_f(size, '4d')} {_f(rho, '4d')} | {_f(avg, '9.3f')} "
              f"{_f(tps, '6.2f')} {_f(dp, '+6.1f%')} | {r['tps']:7.2f} {(r['tps'] / orig - 1) * 100:+6.1f}% "
              f"{r['hit']:6.3f} {r['mass']:6.3f} {r['subs']:8.2f} {_f(r['topk'], '6.2f')} {r['top1']:6.3f} "
              f"{r['h2d']:7.2f} {r['stall']:8.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.75, 0.5, 0.375], choices=[0.75, 0.5, 0.375])
    ap.add_argument("--reading", choices=["cft", "tae", "both"], default="cft",
                    help="the tables' tau as CFT alpha (recommended), as the TAE threshold, or both")
    ap.add_argument("--miss", choices=["load", "cpu", "both"], default="both",
                    help="a miss loads over PCIe (recommended reading), runs on the CPU (llama.cpp), or both")
    args = ap.parse_args()
    readings = ["cft", "tae"] if args.reading == "both" else [args.reading]
    misses = ["load", "cpu"] if args.miss == "both" else [args.miss]
    for reading, miss in ((r, m) for r in readings for m in misses):
        full_ms = 1e3 / measure(scenario(1.0, "Original", None, None, None, reading, miss))["tps"]
        for rate in args.rates:
            rows = table(rate, reading, miss)
            orig, bud = rows[("Original", None, None, None)], rows.get(("BuddyMoE", *HEADLINE[1:]))
            if rate == HEADLINE[0] and bud is not None:
                gain = (bud["tps"] / orig["tps"] - 1) * 100
                print(f"headline (c = 0.375, rho = 3): paper +10.3% tokens/s over Original; moesim {gain:+.1f}% "
                      f"({'sign reproduced' if gain > 0 else 'sign NOT reproduced'})")
            bud3 = rows[("BuddyMoE", 0.95, 16, 3)]
            if orig["h2d"] > 0:
                print(f"Fig. 8: H2D traffic of BuddyMoE (0.95, 16, 3) / Original = {bud3['h2d'] / orig['h2d']:.2f} "
                      "(paper: about 0.80-0.83)")
            c = bud3["counts"]
            if c is not None:
                print(f"BuddyMoE (0.95, 16, 3) planner: {c.swaps} swaps, {c.no_buddy} misses without a resident "
                      f"buddy, {c.rho_cut} cut by rho, {c.tae_blocked} token-layers kept by the TAE gate")
            # the magnitude: what share of Original's miss time (ms/token above c = 1) the rho = 3 row removes
            p_orig = 1e3 / PAPER[rate][0][5]  # type: ignore[operator]
            p_bud = 1e3 / next(r[5] for r in PAPER[rate] if r[1:4] == (0.95, 16, 3))  # type: ignore[operator]
            s_orig, s_bud = 1e3 / orig["tps"], 1e3 / bud3["tps"]
            print(f"miss time per token (ms/token above c = 1): paper Original {p_orig - PAPER_FULL_MS:.1f}, "
                  f"moesim {s_orig - full_ms:.1f}; rho = 3 removes {100 * (p_orig - p_bud) / (p_orig - PAPER_FULL_MS):.0f}% "
                  f"of it in the paper, {100 * (s_orig - s_bud) / max(s_orig - full_ms, 1e-9):.0f}% in moesim")
            for w in orig["warn"]:
                print(f"  warning: {w}")
    print("\nReading the gap: the sign of the headline is reproduced; its size is not. In moesim a swap "
          "removes the whole cost of a miss, BuddyMoE finds a resident buddy for nearly every miss (the "
          "'misses without a resident buddy' count) and rho = 3 seldom binds at top-6 (the 'cut by rho' "
          "count), so the rho = 3 row removes most of Original's miss time (the 'miss time per token' "
          "lines), where the paper's rows remove 16-32% of theirs. The paper's gap between rho = 3 and "
          "unlimited (+10.3% vs +22.0% at c = 0.375) implies unsubstituted misses or per-swap costs that "
          "it does not describe (spec sheet A2, A6, A7).")
    print("\nNot reproducible here: ARC-E / ARC-C / Avg need DeepSeek-V2-Lite's weights and an "
          "evaluation harness; moesim replays recorded routing (later layers as recorded), so a "
          "substitution's effect on answers is not simulated. 'mass' (routing mass kept) and 'top1' "
          "(top-1 agreement) are the trace-level proxies; they measure how much of the routed choice was "
          "replaced, not how good the replacement is (Random and BuddyMoE replacing the same slots score "
          "alike).")


if __name__ == "__main__":
    main()
