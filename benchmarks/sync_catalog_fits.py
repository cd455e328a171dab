"""Write the catalog's fitted entries from the committed fits, so that no catalog number can
outlive the fit it came from (issue 32 item 5).

    python benchmarks/sync_catalog_fits.py            # rewrite the fitted fields and their sources
    python benchmarks/sync_catalog_fits.py --check    # exit 1 naming every field that differs

Each entry of :data:`FITTED` names a catalog field, the fit folder under
``benchmarks/results/fits/`` and the fitted key (and group) it takes. The script rewrites the
field's value (rounded as :data:`DIGITS` says), the field's source (``sources.<field>`` of a
hardware or host entry, ``source`` of a runtime entry, whose text after ``KEEP`` is kept: the fields that
were not fitted) in place, leaving every other line and comment of the catalog files alone.
``tests/test_catalog_fits.py`` fails when the catalog and the fits differ.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
FITS = ROOT / "benchmarks" / "results" / "fits"
CATALOG = ROOT / "sim" / "config" / "catalog"


@dataclass(frozen=True)
class Fitted:
    """One catalog field written from one fitted value."""

    catalog: str            # hardware, hosts or runtime (the catalog file's stem)
    entry: str
    field: str              # layer_us, pcie_gbps, costs.layer_us
    fit: str                # folder under benchmarks/results/fits
    key: str                # the fitted key
    group: str | None = None
    keep: str = ""          # runtime source: the text after this marker is kept (unfitted fields)
    rows_are: str = "baselines only"   # what the fit rows are, as the source says


FITTED: list[Fitted] = [
    Fitted("runtime", "hf-eager-hqq", "layer_us", "eliseev-mazur-2023-table2-one-runtime", "runtime.layer_us",
           keep="; iteration_us: "),
    Fitted("runtime", "moepic-testbed", "layer_us", "moepic-mixtral", "runtime.layer_us", keep="; iteration_us: "),
    Fitted("runtime", "moepic-testbed-qwen", "layer_us", "moepic-qwen", "runtime.layer_us", keep="; iteration_us: "),
    Fitted("runtime", "activeevict-testbed", "layer_us", "activeevict-table3-mixtral", "runtime.layer_us",
           keep="; with cache"),
    Fitted("runtime", "activeevict-testbed-llama", "layer_us", "activeevict-table3-llama", "runtime.layer_us",
           keep="; with cache"),
    Fitted("runtime", "imp-offload", "layer_us", "imp-qwen3-30b-budget", "runtime.layer_us", group="imp-offload",
           keep="; host_memory: ", rows_are="the resident and staging-only arms and the default budget"),
    Fitted("hardware", "rtx-5090-imp", "pageable_gbps", "imp-qwen3-30b-budget", "hardware.pageable_gbps",
           rows_are="the resident and staging-only arms and the default budget"),
    Fitted("hosts", "xeon-gold-6454s", "tflops", "ktransformers-deepseek-v3", "hardware.cpu.tflops"),
    Fitted("hosts", "xeon-gold-6454s-2s", "tflops", "ktransformers-deepseek-v3", "hardware.cpu.tflops"),
    Fitted("runtime", "ktransformers-v0.2", "cpu_switch_us", "ktransformers-deepseek-v3", "runtime.cpu_switch_us",
           keep="; layer_us: "),
    Fitted("hardware", "a6000-moepic-testbed", "pcie_gbps", "moepic-mixtral", "hardware.pcie_gbps"),
    Fitted("hardware", "a6000-moepic-testbed-qwen", "pcie_gbps", "moepic-qwen", "hardware.pcie_gbps"),
    Fitted("hardware", "a100-buddymoe-testbed", "pcie_gbps", "buddymoe-tables2-4", "hardware.pcie_gbps"),
    Fitted("hardware", "a100-buddymoe-testbed", "costs.layer_us", "buddymoe-tables2-4", "hardware.costs.layer_us"),
    Fitted("hardware", "dgx-spark-gb10-llamacpp", "kv_read_gbps", "llamacpp-dgx-spark-qwen3-coder-context",
           "hardware.kv_read_gbps", rows_are="the two shortest depths"),
    Fitted("hardware", "dgx-spark-gb10-llamacpp", "attention_tflops", "llamacpp-dgx-spark-qwen3-coder-prefill-context",
           "hardware.attention_tflops", rows_are="the two shortest depths"),
]
"""Every fitted catalog field and where it comes from."""

DIGITS = {"layer_us": 0, "cpu_switch_us": 0, "costs.layer_us": 0, "pcie_gbps": 2, "pageable_gbps": 2, "kv_read_gbps": 1, "attention_tflops": 1,
          "mem_gbps": 1, "tflops": 2}
"""Decimals each field is written with (microseconds whole; copy GB/s to 10 MB/s; attention's rates and a host's
read rate to 0.1; a host's TFLOP/s to 0.01)."""


def _fit(folder: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((FITS / folder / "fitted.yaml").read_text())
    return data


def _param(f: Fitted) -> dict[str, Any]:
    for p in _fit(f.fit)["parameters"]:
        if p["key"] == f.key and p.get("group") == f.group:
            return dict(p)
    raise SystemExit(f"sync_catalog_fits: {f.fit}/fitted.yaml has no {f.key}"
                     + (f" for {f.group}" if f.group else ""))


def value(f: Fitted) -> float | int:
    """The field's value as the catalog writes it."""
    v = float(_param(f)["value"])
    d = DIGITS[f.field]
    return int(round(v)) if d == 0 else round(v, d)


def _rows(indices: list[int]) -> str:
    """``0-3, 5`` for row indices."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def source(f: Fitted) -> str:
    """The fitted field's source: the fit's command, its fit rows, the value's bound and held-out error."""
    doc = _fit(f.fit)
    fit, p = doc["fit"], _param(f)
    fit_rows = [r["row"] for r in doc["rows"] if r["role"] == "fit"]
    held = p.get("held_out") or fit.get("held_out")
    if held and held.get("rows"):
        held_text = (f"held-out {held['rows']} rows: median |error| {held['median_abs_error_pct']:.1f}%, "
                     f"max {held['max_ratio']:.2f}x, {held['within_1_5x']} within 1.5x")
    else:
        held_text = "no held-out rows"
    bound = ""
    if p.get("at_bound"):
        bound = f"; AT ITS {p['at_bound'].upper()} BOUND {p[p['at_bound']]:g} (not a measurement; missing cost: {p['missing_cost']})"
    elif p.get("bound_source"):
        bound = f"; bounded by {p['bound_source']}"
    label = f.key if f.group is None else f"{f.key}[{p['per']}={f.group}]"
    others = [b for b in fit.get("at_bound") or [] if not b.startswith(f"{label} ")]
    if others:
        bound += f"; other values of this fit at a bound (a cost is missing there): {', '.join(others)}"
    return (f"fit: `{fit['command']}` ({fit['source']}), {f.key} on fit rows {_rows(fit_rows)} "
            f"({f.rows_are}){bound}; {held_text}")


def _block(lines: list[str], entry: str) -> tuple[int, int]:
    start = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == f"{entry}:"), None)
    if start is None:
        raise SystemExit(f"sync_catalog_fits: no entry {entry}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "#", "\n", "")), len(lines))
    return start, end


def _rewrite(lines: list[str], f: Fitted) -> None:
    start, end = _block(lines, f.entry)
    v, src = value(f), source(f)
    done = {"value": False, "source": False}
    for i in range(start + 1, end):
        ln = lines[i]
        if f.field.startswith("costs.") and ln.startswith("  costs: {"):
            name = f.field.split(".", 1)[1]
            lines[i] = re.sub(rf"({name}: )[-0-9.e+]+", rf"\g<1>{v}", ln)
            done["value"] = True
        elif ln.startswith(f"  {f.field}: "):
            lines[i] = f"  {f.field}: {v}\n"
            done["value"] = True
        elif f.catalog in ("hardware", "hosts") and ln.startswith(f"    {f.field.split('.')[0]}: \""):
            lines[i] = f"    {f.field.split('.')[0]}: {json.dumps(src)}\n" if "." not in f.field else ln
            done["source"] = done["source"] or "." not in f.field
        elif f.catalog == "runtime" and ln.startswith("  source: "):
            old = json.loads(ln.split(": ", 1)[1])
            kept = old[old.index(f.keep):] if f.keep and f.keep in old else ""
            lines[i] = f"  source: {json.dumps(src + kept)}\n"
            done["source"] = True
    if f.field.startswith("costs."):
        for i in range(start + 1, end):
            if lines[i].startswith("    costs: \""):
                old = json.loads(lines[i].split(": ", 1)[1])
                kept = old[old.index("; expert_us"):] if "; expert_us" in old else ""
                lines[i] = f"    costs: {json.dumps(src + kept)}\n"
                done["source"] = True
    missing = [k for k, ok in done.items() if not ok]
    if missing:
        raise SystemExit(f"sync_catalog_fits: {f.catalog} {f.entry}: no {' or '.join(missing)} line for {f.field}")


def expected() -> dict[tuple[str, str, str], tuple[float | int, str]]:
    """(catalog, entry, field) -> (value, source) as the committed fits give them."""
    return {(f.catalog, f.entry, f.field): (value(f), source(f)) for f in FITTED}


def differences() -> list[str]:
    """Every fitted field whose catalog value or source differs from its fit."""
    out = []
    for f in FITTED:
        raw = yaml.safe_load((CATALOG / f"{f.catalog}.yaml").read_text())[f.entry]
        have: Any = raw
        for part in f.field.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        want, src = value(f), source(f)
        if have != want:
            out.append(f"{f.catalog} {f.entry}.{f.field}: catalog {have}, fit {f.fit} gives {want}")
        got_src = (raw.get("sources", {}).get(f.field.split(".")[0]) if f.catalog in ("hardware", "hosts")
                   else raw.get("source"))
        if not isinstance(got_src, str) or not got_src.startswith(src):
            out.append(f"{f.catalog} {f.entry}.{f.field}: source is not the fit's ({f.fit})")
    return out


def main() -> None:
    """Rewrite the catalog (or, with --check, list the differences)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if the catalog differs from the fits")
    args = ap.parse_args()
    if args.check:
        diff = differences()
        print("\n".join(diff) if diff else "catalog equals the committed fits")
        sys.exit(1 if diff else 0)
    for catalog in ("hardware", "hosts", "runtime"):
        path = CATALOG / f"{catalog}.yaml"
        lines = path.read_text().splitlines(keepends=True)
        for f in FITTED:
            if f.catalog == catalog:
                _rewrite(lines, f)
        path.write_text("".join(lines))
    diff = differences()
    print("\n".join(diff) if diff else "catalog written from the committed fits")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
