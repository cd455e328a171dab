"""The published rows behind ``simctl advise``'s error bands: every published speed figure of a
system advise recommends, with moesim's prediction beside it, gathered from what the repo
already committed; advise reads the table (``sim/study/advise_bands.csv``) and prints, beside each
system's number, the spread of predicted / published on the rows nearest to it
(:mod:`moesim.sim.study.advise_bands`).

    python benchmarks/advise_bands.py            # rewrites sim/study/advise_bands.csv, ~2 s
    python benchmarks/advise_bands.py --check    # exit 1 when the committed table differs

Nothing is typed in by hand and nothing is re-simulated; the inputs are:

1. ``benchmarks/results/published_systems.md`` (written by ``benchmarks/published_systems.py``):
   the systems people run at the catalogs' figures, nothing fitted to the testbed. Its
   speed-up rows (Fiddler's README) are ratios of two systems, not a system's speed: listed
   with ``counted`` saying so. A row its note calls a probable misprint is listed, not counted.
2. Every fit folder ``benchmarks/results/fits/<set>/rows.csv`` (``simctl fit
   measurements/<set>.yaml --out ...``): its held-out rows (role ``test``) of a speed metric
   (``tokens_per_s``, ``tpot_ms``), not a ratio to another row. A set with fit rows is marked
   ``fitted`` (predicted after fitting to that testbed's other rows); a set with none,
   ``catalog``. The sets that re-fit another set's rows (``VARIANTS`` of
   ``benchmarks/seed_scoreboard.py``) are left out, as the scoreboard leaves them out of its goals.
   A new measurement set is picked up as soon as its fit folder is committed; a set in
   ``measurements/`` without one gets one uncounted row saying so (and a line on stderr), so
   the committed table goes stale, and ``tests/test_advise_bands.py`` fails, whenever a set is
   added, fitted or refitted.

Each row's system is its policy (``accelerate``, ``mixtral-offloading``, ``lru``, ``cpu-moe``,
``fiddler`` are advise's systems; others are listed for completeness), unless its measurement
file declares the published system the policy stands in for (``system:``, for the file or the
row: kTransformers' rows run ``cpu-moe`` with kTransformers' runtime and are ``ktransformers``,
advise's kTransformers band; Fiddler's run ``cpu-moe`` where nothing fits on the GPU and are ``fiddler``), its GPU class
(:func:`moesim.sim.study.advise_bands.gpu_class` of its hardware) and ``speed_ratio``: predicted
/ published in tokens/s terms (a time metric's ratio inverted), so that a ratio above 1 means
moesim was optimistic.

Its ``runtime`` is the catalog runtime it was predicted with, as advise names its options'
runtimes (``RUNTIMES`` of :mod:`moesim.sim.study.advise_options`), so that a band can keep to the
rows that ran the option's runtime: a fit row's own ``set`` runtime, else its measurement file's
``base:`` scenario's, else the scenario default ``none`` (``runtime: NAME`` or ``{base: NAME, ...overrides}`` give ``NAME``; the
overrides are not named), and for ``published_systems.md`` the runtime
``benchmarks/published_systems.py`` predicted its section with (``E_M_RUNTIME``,
``FIDDLER_RUNTIME``, ``MOE_INF_RUNTIME``). A runtime given as a YAML file (a committed fit's
``fitted.yaml``) is written as its path from the repository root, which no catalog name matches;
a spec with no base, as its ``name`` (empty when it has none). As the name leaves the overrides
out, column ``kv_on_host`` says whether the runtime, overrides and all, kept the KV cache in host
memory (``yes``/``no``; ``runtime.kv_on_host``, llama.cpp's ``-nkvo``: the SOSP '25 set's llama.cpp
rows), so that advise's ``-nkvo`` options can keep to those rows.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.published_systems import (  # noqa: E402
    E_M,
    E_M_GPUS,
    E_M_RUNTIME,
    FIDDLER,
    FIDDLER_ENVS,
    FIDDLER_RUNTIME,
    MOE_INF,
    MOE_INF_RUNTIME,
)
from benchmarks.seed_scoreboard import VARIANTS  # noqa: E402
from moesim.sim.config.scenario import Scenario  # noqa: E402
from moesim.sim.study.advise_bands import COLUMNS, TABLE, gpu_class  # noqa: E402
from moesim.sim.study.fit_spec import declared_systems  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "results" / "published_systems.md"
FITS = ROOT / "benchmarks" / "results" / "fits"
MEASUREMENTS = ROOT / "measurements"
OUT = ROOT / "sim" / "study" / TABLE.name
"""Where the table is committed (the file :data:`moesim.sim.study.advise_bands.TABLE` reads)."""
DEFAULT_RUNTIME = str(Scenario.model_fields["runtime"].default)
"""The runtime of a scenario that names none (``none``)."""
SPEED = {"tokens_per_s": False, "tpot_ms": True}
"""Speed metrics a band is made of, and whether each is a time (its ratio inverted)."""


def _hardware_class(ref: Any, base_dir: Path) -> tuple[str, str]:
    """A hardware reference's name and GPU class ("unknown" when it cannot be resolved)."""
    from moesim.sim.config.catalog import CatalogError, get_hardware, is_spec_file, load_spec_file

    try:
        if is_spec_file(ref):
            ref = load_spec_file(base_dir / str(ref), "hardware")
        hw = get_hardware(ref)
    except (CatalogError, ValueError):
        return str(ref), "unknown"
    name = ref if isinstance(ref, str) else str(ref.get("base", hw.name))
    return name, gpu_class(hw.hbm_gbps)


def runtime_name(ref: Any, base_dir: Path) -> str:
    """The runtime a scenario's ``runtime:`` value names (see the module docstring): a catalog
    name as it is, ``{base: NAME, ...}`` as its base, a YAML file (a fit's ``fitted.yaml``) as
    its path from the repository root (its name alone when it lies outside), a spec with no base
    as its ``name`` if any, else ""."""
    from moesim.sim.config.catalog import is_spec_file

    if isinstance(ref, dict):
        return runtime_name(ref["base"], base_dir) if "base" in ref else str(ref.get("name", ""))
    if not isinstance(ref, str):
        return ""
    if is_spec_file(ref):
        path = (base_dir / ref).resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    return ref


def kv_on_host(ref: Any, base_dir: Path) -> str:
    """``yes`` when a scenario's ``runtime:`` value keeps the KV cache in host memory
    (``kv_on_host``: a catalog name's entry, a file's spec, or a base with overrides, the
    overrides winning), else ``no``; a runtime that cannot be resolved says ``no`` only when it
    sets nothing of the kind."""
    from moesim.sim.config.catalog import CatalogError, get_runtime, is_spec_file, load_spec_file

    try:
        if is_spec_file(ref):
            ref = load_spec_file(base_dir / str(ref), "runtime")
        elif isinstance(ref, dict) and is_spec_file(ref.get("base")):
            ref = {**load_spec_file(base_dir / str(ref["base"]), "runtime"), **{k: v for k, v in ref.items() if k != "base"}}
        on = get_runtime(ref).kv_on_host
    except (CatalogError, ValueError, TypeError):
        on = bool(isinstance(ref, dict) and ref.get("kv_on_host"))
    return "yes" if on else "no"


def _published_sections() -> list[tuple[str, list[list[str]]]]:
    """``published_systems.md`` as (section heading, table rows as cells)."""
    out: list[tuple[str, list[list[str]]]] = []
    for line in PUBLISHED.read_text().splitlines():
        if line.startswith("## "):
            out.append((line[3:].strip(), []))
        elif line.startswith("| ") and out and not line.startswith("| row ") and not line.startswith("|---"):
            out[-1][1].append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def published_rows() -> list[dict[str, Any]]:
    """The rows of ``published_systems.md`` (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for heading, cells in _published_sections():
        for label, published, predicted, _ratio, note in cells:
            pub, pred = float(published), float(predicted)
            row: dict[str, Any] = {"source": "benchmarks/results/published_systems.md", "set": heading, "row": label,
                                   "published": pub, "predicted": pred, "prediction": "catalog", "counted": "yes"}
            if heading.startswith(E_M):
                hw = E_M_GPUS[label][0]
                row.update(system="accelerate", metric="tokens_per_s", model=f"mixtral-8x7b-hqq-a4e{heading[len(E_M) + 2]}",
                           runtime=E_M_RUNTIME)
                if "typo" in note:
                    row["counted"] = f"no: {note}"
            elif heading.startswith(FIDDLER):
                env = heading[len(FIDDLER) + 2:]
                hw = FIDDLER_ENVS[env][0]
                row.update(system="fiddler", metric="speed_up", model="mixtral-8x7b", runtime=FIDDLER_RUNTIME,
                           counted="no: a speed-up of two systems, not a system's speed")
            elif heading.startswith(MOE_INF):
                hw = "rtx-a5000"
                row.update(system=label, metric="s_per_token", model=heading[len(MOE_INF) + 2:], runtime=MOE_INF_RUNTIME)
            else:
                raise SystemExit(f"{PUBLISHED}: section {heading!r} is new: teach benchmarks/advise_bands.py its rows")
            row["hardware"], row["gpu_class"] = _hardware_class(hw, ROOT)
            row["kv_on_host"] = kv_on_host(row["runtime"], ROOT)
            time_metric = row["metric"] == "s_per_token"
            row["speed_ratio"] = pub / pred if time_metric else pred / pub
            rows.append(row)
    return rows


def _policy_name(p: Any) -> str:
    return str(p.get("name", "?") if isinstance(p, dict) else p)


def _base(stem: str) -> tuple[dict[str, Any], Path, list[str | None]]:
    """A set's base scenario, the folder its paths are relative to, and each row's declared
    ``system`` (the row's own, else the file's, else None: the row's policy is its system)."""
    path = MEASUREMENTS / f"{stem}.yaml"
    doc = yaml.safe_load(path.read_text())
    base = doc.get("base") or {}
    if isinstance(base, str):   # a scenario file, relative to the measurement file
        base = yaml.safe_load((path.parent / base).read_text())
    return base, path.parent, declared_systems(doc)


def fit_rows() -> list[dict[str, Any]]:
    """The held-out speed rows of every committed fit folder (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for folder in sorted(p for p in FITS.iterdir() if (p / "rows.csv").is_file()):
        stem = folder.name
        if stem in VARIANTS or not (MEASUREMENTS / f"{stem}.yaml").is_file():
            continue
        base, base_dir, systems = _base(stem)
        with open(folder / "rows.csv", newline="") as f:
            table = list(csv.DictReader(f))
        kind = "fitted" if any(r["role"] == "fit" for r in table) else "catalog"
        for r in table:
            if r["role"] != "test" or r["metric"] not in SPEED or r["relative_to"]:
                continue
            setting = json.loads(r["set"])
            hw_ref = setting.get("hardware", base.get("hardware"))
            hardware, cls = _hardware_class(hw_ref, base_dir)
            pub, pred = float(r["measured"]), float(r["predicted"])
            runtime = setting.get("runtime", base.get("runtime", DEFAULT_RUNTIME))
            rows.append({"source": f"benchmarks/results/fits/{stem}/rows.csv", "set": stem, "row": r["row"],
                         "system": systems[int(r["row"])] or _policy_name(setting.get("policy", base.get("policy"))),
                         "hardware": hardware, "gpu_class": cls,
                         "model": str(setting.get("model", base.get("model", "?"))), "metric": r["metric"],
                         "published": pub, "predicted": pred,
                         "speed_ratio": pub / pred if SPEED[r["metric"]] else pred / pub,
                         "prediction": kind, "counted": "yes",
                         "runtime": runtime_name(runtime, base_dir), "kv_on_host": kv_on_host(runtime, base_dir)})
    return rows


def unfitted_rows() -> list[dict[str, Any]]:
    """One uncounted row per measurement set without a committed fit folder, so that the table
    names every set (and differs from the committed one as soon as a set is added)."""
    return [{"source": f"measurements/{stem}.yaml", "set": stem, "row": "", "system": "", "hardware": "",
             "gpu_class": "", "model": "", "metric": "", "published": "", "predicted": "", "speed_ratio": "",
             "prediction": "", "runtime": "", "kv_on_host": "", "counted": f"no: no committed fit folder (simctl fit measurements/{stem}.yaml "
                                          f"--out benchmarks/results/fits/{stem}, then rerun this script)"}
            for stem in unfitted_sets()]


def table_text() -> str:
    """The table as CSV text (what ``sim/study/advise_bands.csv`` must hold)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in published_rows() + fit_rows() + unfitted_rows():
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()


def unfitted_sets() -> list[str]:
    """Measurement sets with no committed fit folder (their rows cannot be counted yet)."""
    return sorted(p.stem for p in MEASUREMENTS.glob("*.yaml")
                  if not (FITS / p.stem / "rows.csv").is_file() and p.stem not in VARIANTS)


def main() -> None:
    """Write (or ``--check``) the committed table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed table differs")
    args = ap.parse_args()
    text = table_text()
    for stem in unfitted_sets():
        print(f"not counted: measurements/{stem}.yaml has no benchmarks/results/fits/{stem}/rows.csv "
              f"(simctl fit measurements/{stem}.yaml --out benchmarks/results/fits/{stem})", file=sys.stderr)
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'differs: run python benchmarks/advise_bands.py'}")
        sys.exit(0 if same else 1)
    tmp = OUT.with_name(f".{OUT.name}.{os.getpid()}.tmp")   # the repository's own file: written whole
    tmp.write_text(text)
    os.replace(tmp, OUT)
    rows = list(csv.DictReader(io.StringIO(text)))
    print(f"wrote {OUT.relative_to(ROOT)}: {len(rows)} rows, {sum(r['counted'] == 'yes' for r in rows)} counted")


if __name__ == "__main__":
    main()
