"""``simctl fit`` wall time on a 24-row, 2-group measurement set (the goal: under 60 s on 2 cores).

The set has the shape of Eliseev & Mazur's Table 2: 4 GPUs x 2 expert bit widths x 3 algorithms
(mixtral-offloading, lru, no-cache), Mixtral-8x7B with HQQ experts, 2 cached experts per layer
for the algorithms with a cache. The 2-bit rows are fit rows, the 3-bit rows held out. Two keys
are fitted per GPU (``runtime.layer_us`` and ``hardware.pcie_gbps``: 8 free values). The
"measurements" are the simulator's own TPOT at known values per GPU times seeded log-normal
noise (``--noise``), so the fit has a known answer and a non-zero residual. The workload is
short, as a measurement file's base should choose: a synthetic trace of 2 requests x
``--decode-len`` decode tokens.

Prints, for each run of ``simctl fit`` (a fresh process each, so imports and worker start-up
count): the command, its wall time, and the fitted values against the true ones.

    python benchmarks/bench_fit.py [--decode-len 16] [--noise 0.05] [--jobs 1,2] [--loo one-step,refit]
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

TRUE = {"a100-sxm-80gb": (6000.0, 18.0), "rtx-a6000": (5000.0, 14.0), "rtx-3080-laptop-16gb": (9000.0, 11.0),
        "t4": (7000.0, 6.0)}
ALGORITHMS = (("mixtral-offloading", {"policy": "mixtral-offloading"}), ("lru", {"policy": "lru"}),
              ("no-cache", {"policy": "no-cache"}))


def measurement_file(decode_len: int, noise: float, seed: int = 0) -> dict[str, Any]:
    """The 24-row set (see the module)."""
    from moesim.sim.config.scenario import load_scenario_data, set_key
    from moesim.sim.run.runner import run_loaded

    base = {"trace": {"synthetic": {"model": "mixtral-8x7b", "requests": 2, "prompt_len": 8,
                                    "decode_len": decode_len, "seed": 1}},
            "runtime": "hf-eager-hqq", "cache": {"experts_per_layer": 2}, "workload": {"phases": ["decode"]}}
    rng = np.random.default_rng(seed)
    rows = []
    for hw, (layer_us, pcie) in TRUE.items():
        for model, role in (("mixtral-8x7b-hqq-a4e2", "fit"), ("mixtral-8x7b-hqq-a4e3", "test")):
            for _name, setting in ALGORITHMS:
                row_set = {"hardware": hw, "model": model, **setting}
                data = copy.deepcopy(base)
                for k, v in {**row_set, "runtime.layer_us": layer_us, "hardware.pcie_gbps": pcie}.items():
                    set_key(data, k.split("."), v, k)
                m = run_loaded(load_scenario_data(data, source="bench", base_dir=Path(".")), steps=False).metrics
                measured = m["tpot_ms"]["mean"] * float(np.exp(rng.normal(0, noise)))
                rows.append({"set": row_set, "tpot_ms": round(measured, 3), "role": role,
                             "source": f"simulator at layer_us {layer_us:g}, pcie_gbps {pcie:g}, x noise"})
    return {"name": "bench-24-rows", "source": f"the simulator at known values, log-normal noise sigma {noise}",
            "base": base, "fit": {"runtime.layer_us": {"min": 100, "max": 50000, "per": "hardware"},
                                  "hardware.pcie_gbps": {"min": 1, "max": 64, "per": "hardware"}},
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-len", type=int, default=16)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--loo", default="one-step,refit")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measurements.yaml"
        path.write_text(yaml.safe_dump(measurement_file(args.decode_len, args.noise), sort_keys=False))
        for loo in args.loo.split(","):
            for jobs in args.jobs.split(","):
                out = Path(tmp) / f"out-{loo}-{jobs}"
                cmd = [sys.executable, "-m", "moesim.sim.cli.main", "fit", str(path), "--out", str(out),
                       "--jobs", jobs, "--loo", loo]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - t0
                if proc.returncode:
                    sys.exit(f"simctl fit failed: {proc.stderr.strip()}")
                print(f"$ simctl fit measurements.yaml --out DIR --jobs {jobs} --loo {loo}: {wall:.1f} s wall")
                print("\n".join(ln for ln in proc.stdout.splitlines()
                                if ln.startswith(("fit rows", "leave-one-out", "held-out")) or "simulator runs" in ln))
                doc = yaml.safe_load((out / "fitted.yaml").read_text())
                for p in doc["parameters"]:
                    true = TRUE[p["group"]][0 if p["key"] == "runtime.layer_us" else 1]
                    print(f"  {p['key']:20s} {p['group']:22s} fitted {p['value']:10.4g}  true {true:8.4g}  "
                          f"({p['value'] / true - 1:+.1%})")


if __name__ == "__main__":
    main()
