"""fMoE's section 6.2 / Fig. 9 comparison next to the simulator's: TTFT, TPOT and expert hit
rate of fMoE against DeepSpeed-Inference (lru, on demand), Mixtral-Offloading (synchronous
next-layer prefetch), ProMoE (promoe-style, approximate) and MoE-Infinity (synchronous,
d = 3), as ratios baseline / fMoE; then the matcher and cache ablations of Fig. 12.

    python benchmarks/fmoe_table.py                 # ~2-4 min on 2 cores
    python benchmarks/fmoe_table.py --gib 6 24      # other cache limits (Fig. 11 points)
    python benchmarks/fmoe_table.py --preset mixtral-8x7b-legacy --requests 10 --profile 7   # before issue 32

Setup: as measurements/fmoe-end-to-end.yaml for Mixtral-8x7B (6 x RTX 3090 approximated as one
device with 6 copy engines; every system on the MoE-Infinity codebase's runtime, the runtime
section of benchmarks/results/fits/moe-infinity-readme/fitted.yaml; the fitted synthetic Mixtral
routing, issue 32 item 4, with logits
and embeddings; the store and MoE-Infinity's collection pre-filled from the first 32 of 35
requests, a full 1K-map store as section 6.3 says the offline runs had; the other 3 replayed,
prefill and decode, batch 1). The paper reports averages over three models and two datasets;
this table runs Mixtral alone (``python benchmarks/fmoe_fit.py`` runs the set's three models).

Like with like: every system gets the same pool layout, one global pool of the given size
(``cache.scope: global``, fMoE's own; per-layer pools of 12 GB would hold about one Mixtral
expert per layer, so a prefill would load its experts one at a time whatever the policy), and
hit rates are compared as hit + late: a synchronous baseline waits before each layer for its
prefetches, so what it prefetched is resident (a hit) when routed, while fMoE's copies still
in flight are late. "hit" alone (resident when routed) is printed beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper_runs import run_scenario  # noqa: E402
from moesim.sim.config.catalog import get_model  # noqa: E402
from moesim.traces.synthetic.presets import PRESETS  # noqa: E402

GIB = 2**30
RUNTIME = ROOT / "benchmarks" / "results" / "fits" / "moe-infinity-readme" / "fitted.yaml"
"""The MoE-Infinity codebase's runtime every system runs on, as in measurements/fmoe-end-to-end.yaml
(fMoE sections 5 and 6.2: fMoE and every baseline are built on that codebase)."""

# section 6.2: fMoE's reductions vs each baseline, as ratios baseline / fMoE
PAPER = {  # (TTFT ratio, TPOT ratio, hit-rate ratio baseline / fMoE)
    "DeepSpeed": (1 / 0.56, 1 / 0.30, 1 / 2.47), "Mixtral-Offloading": (1 / 0.65, 1 / 0.39, 1 / 1.11),
    "ProMoE": (1 / 0.67, 1 / 0.45, 1 / 1.34), "MoE-Infinity": (1 / 0.70, 1 / 0.52, 1 / 1.63),
}
METHODS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "DeepSpeed": ("lru", {}, False),
    "Mixtral-Offloading": ("mixtral-offloading", {}, True),
    "ProMoE": ("promoe-style", {"stride": 3}, False),
    "MoE-Infinity": ("moe-infinity", {"prefetch_distance": 3}, True),
    "fMoE": ("fmoe", {"prefetch_distance": 3, "store_capacity": 1000}, False),
}
ABLATIONS = {"Speculate": {"matcher": "speculate"}, "Hit count": {"matcher": "hit-count"},
             "Map(T)": {"semantic": False, "dynamic_threshold": False},
             "Map(T+S)": {"dynamic_threshold": False}, "Map(T+S+delta)": {},
             "cache LRU": {"eviction": "lru"}, "cache LFU": {"eviction": "lfu"}}


def scenario(policy: str, params: dict[str, Any], sync: bool, gib: float, *, preset: str = "mixtral-8x7b",
             requests: int = 35, profile: int = 32, tokens: int = 32) -> dict[str, Any]:
    """One system's scenario: ``profile`` of ``requests`` requests fill the store, the rest replay."""
    return {"name": f"fmoe-{policy}",
            "trace": {"synthetic": {"preset": preset, "requests": requests, "prompt_len": tokens,
                                    "decode_len": tokens, "seed": 0}},
            "profile": {"requests": profile}, "model": "mixtral-8x7b",
            "hardware": {"base": "rtx-3090", "vram_gib": 144, "copy_engines": 6}, "runtime": str(RUNTIME),
            "cache": {"gib": gib, "scope": "global"}, "pcie": {"sync_prefetch": sync},
            "policy": {"name": policy, "params": params},
            "workload": {"batch_size": 1, "phases": ["prefill", "decode"]}, "seed": 0}


def measure(data: dict[str, Any]) -> dict[str, Any]:
    m, pol = run_scenario(data)
    pf = getattr(pol, "prefetcher", None)
    return {"ttft": m["ttft_ms"]["mean"], "tpot": m["tpot_ms"]["mean"], "hit": m["hit_rate"],
            "hitlate": m["hit_rate"] + m["late_rate"], "warn": m["warnings"],
            "matches": getattr(pf, "matches", None), "issued": getattr(pf, "issued", None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[12.0], help="expert cache limits (GB)")
    ap.add_argument("--preset", default="mixtral-8x7b", help="synthetic routing preset (default: the fitted one)")
    ap.add_argument("--requests", type=int, default=35, help="requests (the profile's, then the replayed ones)")
    ap.add_argument("--profile", type=int, default=32, help="requests that fill the store and the collection")
    ap.add_argument("--tokens", type=int, default=32, help="prompt and decode tokens per request")
    args = ap.parse_args()
    if args.preset not in PRESETS:
        sys.exit(f"fmoe_table: unknown --preset {args.preset!r} (known: {', '.join(PRESETS)})")
    if not 0 < args.profile < args.requests:
        sys.exit(f"fmoe_table: --profile {args.profile} must be between 0 and --requests {args.requests}")
    setup = {"preset": args.preset, "requests": args.requests, "profile": args.profile, "tokens": args.tokens}
    for gib in args.gib:
        print(f"\n== fMoE section 6.2, Mixtral-8x7B ({args.preset} routing, {args.profile} of {args.requests} "
              f"requests profiled), expert cache {gib:g} GiB ==")
        res = {k: measure(scenario(p, prm, sync, gib, **setup))
               for k, (p, prm, sync) in METHODS.items()}
        f = res["fMoE"]
        print("one global pool for every system; hit rates compared as hit + late")
        print(f"{'method':19} {'TTFT ms':>9} {'TPOT ms':>9} {'hit':>6} {'hit+late':>9} | "
              f"{'TTFT x fMoE':>11} {'paper':>6} {'TPOT x':>7} {'paper':>6} {'h+l x':>6} {'paper':>6}")
        for k, r in res.items():
            row = (f"{k:19} {r['ttft']:9.1f} {r['tpot']:9.1f} {r['hit']:6.3f} {r['hitlate']:9.3f} | ")
            if k in PAPER:
                p = PAPER[k]
                row += (f"{r['ttft'] / f['ttft']:11.2f} {p[0]:6.2f} {r['tpot'] / f['tpot']:7.2f} {p[1]:6.2f} "
                        f"{r['hitlate'] / f['hitlate']:6.2f} {p[2]:6.2f}")
            print(row)
        slower = [k for k in PAPER if res[k]["tpot"] <= f["tpot"] or res[k]["ttft"] <= f["ttft"]]
        pref = ["Mixtral-Offloading", "ProMoE", "MoE-Infinity"]
        hit_ok = [k for k in pref if res[k]["hitlate"] >= f["hitlate"]]
        print("sign of the headline: lower TTFT and TPOT than every baseline: "
              + ("yes" if not slower else f"NO against {', '.join(slower)}")
              + "; higher hit + late rate than the prefetch baselines: "
              + ("yes" if not hit_ok else f"NO against {', '.join(hit_ok)} "
                 f"({', '.join(format(res[k]['hitlate'], '.3f') for k in hit_ok)} vs fMoE {f['hitlate']:.3f})"))
        print(f"fMoE: {f['matches']} map matches, {f['issued']} prefetches issued")
        model = get_model("mixtral-8x7b")
        slots, per_token = int(gib * GIB // model.expert_bytes), model.num_layers * model.top_k
        if res["DeepSpeed"]["hit"] < 0.01 and per_token > slots:
            print(f"DeepSpeed (LRU on demand) hits {res['DeepSpeed']['hit']:.3f}: a token routes "
                  f"{per_token} experts layer by layer and the global pool holds {slots}, so LRU "
                  "evicts each expert before its layer comes round again")
        for w in f["warn"]:
            print(f"  warning: {w}")
        print(f"-- Fig. 12 ablations ({gib:g} GiB): paper: Hit count worst, Map(T) < Map(T+S) < "
              "Map(T+S+delta); LRU < LFU < fMoE --")
        abl = {}
        for name, params in ABLATIONS.items():
            r = abl[name] = measure(scenario("fmoe", {"prefetch_distance": 3, **params}, False, gib, **setup))
            print(f"{name:16} hit {r['hit']:.3f}  hit+late {r['hitlate']:.3f}  TPOT {r['tpot']:7.1f} ms")
        if hit_ok:
            print(f"why the hit-rate sign is not reproduced: on this synthetic trace the next router's "
                  f"lookahead predicts far better than the stored maps three layers ahead: fMoE's own cache "
                  f"with the Speculate matcher reaches hit + late {abl['Speculate']['hitlate']:.3f} against "
                  f"{f['hitlate']:.3f} with maps (benchmarks/fmoe_fit.py: fMoE with perfect maps).")


if __name__ == "__main__":
    main()
