"""The bad-input corpus: every entry point given input a user could plausibly get wrong.

Each case runs ``simctl`` in-process and must end with exit status 2, exactly one line on
stderr that starts ``simctl: error:`` and names the culprit (the case's ``culprit`` strings:
file, row or column, YAML path, option), no traceback, and nothing written: the folder the case
runs in holds the same files afterwards as before (no half-written output, no hidden temporary
folder). Trace files with wrong Arrow types and values are built from the bundled sample.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from moesim.sim.cli import main
from tests.util import ROOT

SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
DELETE = object()


def base_scenario() -> dict[str, Any]:
    """The quickstart on 2 requests, with an absolute trace path (a valid scenario)."""
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    data["trace"] = str(SAMPLE)
    data["workload"]["requests"] = 2
    return data


def scen(**changes: Any) -> str:
    """YAML text of the base scenario with dotted keys (``cache__gib``) changed or deleted."""
    data = base_scenario()
    for key, value in changes.items():
        path = key.split("__")
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def small_table() -> pa.Table:
    """The first two requests of the sample (1024 rows), a valid trace."""
    return pq.read_table(SAMPLE).slice(0, 1024)


def write_trace(path: Path, table: pa.Table, meta: Any = "keep") -> None:
    """Write ``table`` with the sample's moe-trace metadata (or ``meta``: a dict, raw bytes, or
    None for none)."""
    sample_meta = pq.read_schema(SAMPLE).metadata
    if meta == "keep":
        md = sample_meta
    elif meta is None:
        md = None
    else:
        md = {b"moe_trace": meta if isinstance(meta, bytes) else json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(md), path)


def sample_meta() -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(pq.read_schema(SAMPLE).metadata[b"moe_trace"])
    return meta


def set_column(table: pa.Table, name: str, arr: pa.Array | pa.ChunkedArray) -> pa.Table:
    i = table.schema.get_field_index(name)
    if i < 0:
        return table.append_column(name, arr)
    return table.set_column(i, pa.field(name, arr.type), arr)


def mutate(name: str, fn: Callable[[list[Any]], list[Any]], type_: pa.DataType | None = None) -> Callable[[Path], None]:
    """A trace whose column ``name`` is ``fn(values)`` (of Arrow type ``type_``)."""
    def build(path: Path) -> None:
        t = small_table()
        values = fn(t.column(name).to_pylist())
        write_trace(path, set_column(t, name, pa.array(values, type=type_)))
    return build


def with_meta(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A trace whose metadata ``change`` edits in place (or replaces: a ``bytes`` answer)."""
    def build(path: Path) -> None:
        meta = sample_meta()
        out = change(meta)
        write_trace(path, small_table(), out if isinstance(out, bytes) else meta)
    return build


def drop_column(name: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        write_trace(path, small_table().drop_columns([name]))
    return build


def rows(fn: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        write_trace(path, fn(small_table()))
    return build


def renumber(col: str, fn: Callable[[int], int]) -> Callable[[Path], None]:
    return mutate(col, lambda v: [fn(x) for x in v], pa.int32())


def at(values: list[Any], index: int, value: Any) -> list[Any]:
    values = list(values)
    values[index] = value
    return values


Files = dict[str, "str | bytes | Callable[[Path], None]"]


@dataclass
class Case:
    """One bad input: files to create, the command line (``{tmp}`` is the case's folder), and
    the strings the error line must contain."""

    id: str
    argv: list[str]
    culprit: list[str]
    files: Files = field(default_factory=dict)
    needs: str | None = None    # an optional module the case needs


CASES: list[Case] = []


def case(id: str, argv: str | list[str], *culprit: str, files: Files | None = None, needs: str | None = None) -> None:
    CASES.append(Case(id, argv.split() if isinstance(argv, str) else argv, list(culprit), files or {}, needs))


def scenario_case(id: str, text: str | bytes, *culprit: str, extra: list[str] | None = None,
                  files: Files | None = None) -> None:
    """``simctl run s.yaml`` on a bad scenario file."""
    case(f"scenario-{id}", ["run", "{tmp}/s.yaml", *(extra or [])], *culprit, files={"s.yaml": text, **(files or {})})


def trace_case(id: str, build: Callable[[Path], None], *culprit: str, run: bool = True) -> None:
    """``simctl trace inspect`` and ``simctl run`` on a bad trace file: both name it (``run``
    False: the value is in a column an LRU run does not read, so only the inspection sees it)."""
    case(f"inspect-{id}", "trace inspect {tmp}/t.parquet", "t.parquet", *culprit, files={"t.parquet": build})
    if not run:
        return
    case(f"run-{id}", "run {tmp}/s.yaml", "t.parquet", *culprit,
         files={"t.parquet": build, "s.yaml": scen(trace="t.parquet")})


# ---------------------------------------------------------------------------------------------
# the command line itself
case("unknown-command", "frobnicate", "frobnicate")
case("unknown-option", "run scenarios/quickstart.yaml --fast", "--fast")
case("run-missing-scenario", "run {tmp}/nope.yaml", "nope.yaml")
case("run-scenario-is-folder", "run {tmp}", "directory")
case("run-set-no-equals", ["run", str(QUICKSTART), "--set", "cache.rate"], "cache.rate", "KEY=VALUE")
case("run-set-empty-key", ["run", str(QUICKSTART), "--set", "=3"], "--set")
case("run-set-unknown-key", ["run", str(QUICKSTART), "--set", "cache.rat=0.5"], "cache.rat")
case("run-set-unknown-top", ["run", str(QUICKSTART), "--set", "polcy=lfu"], "polcy")
case("run-set-bad-value", ["run", str(QUICKSTART), "--set", "cache.rate=abc"], "cache.rate")
case("run-set-rate-over-1", ["run", str(QUICKSTART), "--set", "cache.rate=1.5"], "cache.rate")
case("run-set-into-scalar", ["run", str(QUICKSTART), "--set", "seed.x=1"], "seed")
case("run-set-unknown-policy", ["run", str(QUICKSTART), "--set", "policy=lur"], "policy", "lur")
case("run-set-policy-param", ["run", str(QUICKSTART), "--set", "policy.params.nope=1"], "nope")
case("run-out-is-file", "run {tmp}/s.yaml --out {tmp}/f", "f", files={"s.yaml": scen(), "f": "x"})
case("run-out-parent-is-file", "run {tmp}/s.yaml --out {tmp}/f/o", "f", files={"s.yaml": scen(), "f": "x"})
case("run-out-not-empty", "run {tmp}/s.yaml --out {tmp}/o", "o", "--force",
     files={"s.yaml": scen(), "o/keep.txt": "mine"})
case("run-out-unwritable", "run {tmp}/s.yaml --out /proc/moesim-out", "/proc/moesim-out", files={"s.yaml": scen()})
case("run-timeline-without-out", "run {tmp}/s.yaml --timeline", "--timeline", "--out", files={"s.yaml": scen()})
case("policies-unknown", "policies lur", "lur")
case("hardware-unknown", "hardware rtx-5090x", "rtx-5090x")
case("hardware-missing-file", "hardware {tmp}/hw.yaml", "hw.yaml")
case("hardware-bad-yaml", "hardware {tmp}/hw.yaml", "hw.yaml", files={"hw.yaml": "pcie_gbps: [1,\n"})
case("hardware-bad-field", "hardware {tmp}/hw.yaml", "hw.yaml", "pcie_gbps",
     files={"hw.yaml": "hardware: {base: rtx-4090, pcie_gbps: fast}\n"})
case("calibrate-out-not-yaml", "calibrate -o {tmp}/p.txt --model flame-moe-290m", "p.txt")
case("calibrate-out-parent-file", "calibrate -o {tmp}/f/p.yaml --model flame-moe-290m", "f", files={"f": "x"})
case("calibrate-out-exists", "calibrate -o {tmp}/p.yaml --model flame-moe-290m", "p.yaml", "--force",
     files={"p.yaml": "mine: 1\n"})
case("calibrate-no-model", "calibrate -o {tmp}/p.yaml", "--model")
case("calibrate-threads-0", "calibrate -o {tmp}/p.yaml --threads 0", "--threads")
case("validate-missing-scenario", "validate {tmp}/nope.yaml", "nope.yaml")
case("validate-missing-profile", "validate {tmp}/s.yaml --profile {tmp}/p.yaml", "p.yaml", files={"s.yaml": scen()})
case("validate-bad-scenario", "validate {tmp}/s.yaml", "cache.rate", files={"s.yaml": scen(cache={"rate": 2})})

# ---------------------------------------------------------------------------------------------
# scenario files
scenario_case("yaml-syntax", "name: x\ncache: {rate: 0.5\n", "s.yaml", "line")
scenario_case("yaml-bad-utf8-line", scen().replace("policy: lru", "policy: l\udcffru").encode("utf-8", "surrogateescape"),
              "s.yaml", "line")
scenario_case("yaml-tab-indent", "name: x\ncache:\n\trate: 0.5\n", "s.yaml", "line 3")
scenario_case("yaml-duplicate-key", scen() + "policy: lfu\n", "s.yaml", "policy", "line")
scenario_case("yaml-duplicate-nested", scen().replace("  rate: 0.25\n", "  rate: 0.25\n  rate: 0.5\n"),
              "s.yaml", "rate", "line")
scenario_case("yaml-top-list", "- a\n- b\n", "s.yaml", "mapping")
scenario_case("yaml-top-scalar", "just words\n", "s.yaml", "mapping")
scenario_case("yaml-empty", "", "s.yaml", "trace")
scenario_case("yaml-anchor-unknown", "a: *nope\n", "s.yaml", "line 1")
scenario_case("yaml-python-tag", "name: !!python/object:os.system x\n", "s.yaml", "line 1")
scenario_case("unknown-top-key", scen(polcy="lfu"), "polcy")
scenario_case("missing-trace", scen(trace=DELETE), "trace")
scenario_case("missing-hardware", scen(hardware=DELETE), "hardware")
scenario_case("missing-cache", scen(cache=DELETE), "cache")
scenario_case("missing-policy", scen(policy=DELETE), "policy")
scenario_case("name-list", scen(name=[1, 2]), "name")
scenario_case("trace-missing-file", scen(trace="nope.parquet"), "nope.parquet")
scenario_case("trace-is-folder", scen(trace="."), "directory")
scenario_case("trace-number", scen(trace=3), "trace")
scenario_case("trace-mapping-other", scen(trace={"file": "x"}), "trace")
scenario_case("trace-synthetic-scalar", scen(trace={"synthetic": 3}), "trace.synthetic")
scenario_case("trace-synthetic-unknown", scen(trace={"synthetic": {"presett": "mixtral-8x7b"}}, model=DELETE),
              "trace.synthetic", "presett")
scenario_case("trace-synthetic-preset", scen(trace={"synthetic": {"preset": "nope"}}, model=DELETE),
              "trace.synthetic", "nope")
scenario_case("trace-synthetic-huge", scen(trace={"synthetic": {"model": "mixtral-8x7b", "requests": 1000000,
                                                                "decode_len": 1000000}}, model=DELETE),
              "trace.synthetic", "rows")
scenario_case("model-unknown", scen(model="flame-moe-2900m"), "model", "flame-moe-2900m")
scenario_case("model-base-list", scen(model={"base": ["a", "b"]}), "model.base")
scenario_case("model-base-unknown", scen(model={"base": "nope"}), "model", "nope")
scenario_case("model-field-unknown", scen(model={"base": "flame-moe-290m", "num_layerz": 2}), "model", "num_layerz")
scenario_case("model-field-type", scen(model={"base": "flame-moe-290m", "top_k": "six"}), "model.top_k")
scenario_case("model-field-negative", scen(model={"base": "flame-moe-290m", "hidden_size": -1}), "model.hidden_size")
scenario_case("model-shape-mismatch", scen(model="mixtral-8x7b"), "model", "trace")
scenario_case("model-number", scen(model=5), "model")
scenario_case("hardware-unknown", scen(hardware="rtx-4091"), "hardware", "rtx-4091")
scenario_case("hardware-base-list", scen(hardware={"base": ["rtx-4090"]}), "hardware.base")
scenario_case("hardware-field-unknown", scen(hardware={"base": "rtx-4090", "pcie": 3}), "hardware", "pcie")
scenario_case("hardware-pcie-zero", scen(hardware={"base": "rtx-4090", "pcie_gbps": 0}), "hardware.pcie_gbps")
scenario_case("hardware-pcie-inf", scen(hardware={"base": "rtx-4090", "pcie_gbps": float("inf")}), "hardware.pcie_gbps")
scenario_case("hardware-pcie-nan", scen(hardware={"base": "rtx-4090", "pcie_gbps": float("nan")}), "hardware.pcie_gbps")
scenario_case("hardware-engines-frac", scen(hardware={"base": "rtx-4090", "copy_engines": 1.5}), "hardware.copy_engines")
scenario_case("hardware-costs-unknown", scen(hardware={"base": "rtx-4090", "costs": {"layer": 3}}), "hardware", "layer")
scenario_case("hardware-file-missing", scen(hardware="hw.yaml"), "hardware", "hw.yaml")
scenario_case("hardware-file-bad", scen(hardware="hw.yaml"), "hw.yaml", files={"hw.yaml": "a: [\n"})
scenario_case("hardware-vram-too-small", scen(hardware={"base": "rtx-4090", "vram_gib": 0.1}), "vram")
scenario_case("runtime-unknown", scen(runtime="vllm"), "runtime", "vllm")
scenario_case("runtime-field", scen(runtime={"base": "hf-eager", "layer_us": -3}), "runtime.layer_us")
scenario_case("cache-none", scen(cache={"initial": "empty"}), "cache", "rate")
scenario_case("cache-two", scen(cache={"rate": 0.5, "gib": 1}), "cache", "gib")
scenario_case("cache-rate-zero", scen(cache={"rate": 0}), "cache.rate")
scenario_case("cache-rate-string", scen(cache={"rate": "half"}), "cache.rate")
scenario_case("cache-rate-bool", scen(cache={"rate": True}), "cache.rate")
scenario_case("cache-gib-inf", scen(cache={"gib": float("inf")}), "cache.gib")
scenario_case("cache-gib-nan", scen(cache={"gib": float("nan")}), "cache.gib")
scenario_case("cache-gib-negative", scen(cache={"gib": -1}), "cache.gib")
scenario_case("cache-epl-too-many", scen(cache={"experts_per_layer": 65}), "cache.experts_per_layer", "64")
scenario_case("cache-gib-too-small", scen(cache={"gib": 0.001}), "cache.gib", "expert")
scenario_case("cache-gib-over-vram", scen(cache={"gib": 1000}), "cache.gib", "GiB of rtx-4090")
scenario_case("cache-initial", scen(cache={"rate": 0.5, "initial": "full"}), "cache.initial")
scenario_case("cache-buffer-negative", scen(cache={"rate": 0.5, "buffer_experts": -1}), "cache.buffer_experts")
scenario_case("cache-swap-string", scen(cache={"rate": 0.5, "swap_out": "maybe"}), "cache.swap_out")
scenario_case("cache-unknown", scen(cache={"rate": 0.5, "size": 3}), "cache.size")
scenario_case("cache-scalar", scen(cache=0.5), "cache")
scenario_case("policy-unknown", scen(policy="lur"), "policy", "lur")
scenario_case("policy-number", scen(policy=3), "policy")
scenario_case("policy-no-name", scen(policy={"params": {}}), "policy.name")
scenario_case("policy-params-list", scen(policy={"name": "lru", "params": [1]}), "policy.params")
scenario_case("policy-param-unknown", scen(policy={"name": "mixtral-offloading", "params": {"prefetch": 2}}),
              "prefetch")
scenario_case("policy-param-frac", scen(policy={"name": "mixtral-offloading", "params": {"prefetch_experts": 2.5}}),
              "prefetch_experts")
scenario_case("policy-param-negative", scen(policy={"name": "mixtral-offloading", "params": {"prefetch_experts": -1}}),
              "prefetch_experts")
scenario_case("policy-param-bool-string", scen(policy={"name": "moepic", "params": {"configurator": "yes"}}),
              "configurator")
scenario_case("policy-param-inf", scen(policy={"name": "moepic", "params": {"omega": float("inf")}}), "omega")
scenario_case("policy-param-string", scen(policy={"name": "moe-infinity", "params": {"cross_token": "nope"}}),
              "cross_token")
scenario_case("policy-param-bool-for-int", scen(policy={"name": "mixtral-offloading", "params": {"prefetch_experts": True}}),
              "prefetch_experts")
scenario_case("plugins-missing", scen(plugins=["nope.py"]), "nope.py")
scenario_case("plugins-syntax", scen(plugins=["p.py"]), "p.py", files={"p.py": "def (:\n"})
scenario_case("plugins-raises", scen(plugins=["p.py"]), "p.py", files={"p.py": "raise RuntimeError('boom')\n"})
scenario_case("plugins-scalar", scen(plugins="p.py"), "plugins")
scenario_case("pcie-order", scen(pcie={"order": "lifo"}), "pcie.order")
scenario_case("pcie-unknown", scen(pcie={"sync": True}), "pcie.sync")
scenario_case("profile-empty", scen(profile={}), "profile")
scenario_case("profile-zero", scen(profile={"requests": 0}), "profile.requests")
scenario_case("profile-all-requests", scen(profile={"requests": 32}, workload={"requests": "all"}), "profile.requests")
scenario_case("profile-trace-missing", scen(profile={"trace": "nope.parquet"}), "nope.parquet")
scenario_case("workload-batch-zero", scen(workload={"batch_size": 0}), "workload.batch_size")
scenario_case("workload-batch-frac", scen(workload={"batch_size": 1.5}), "workload.batch_size")
scenario_case("workload-phase", scen(workload={"phases": ["prefil"]}), "workload.phases")
scenario_case("workload-phases-empty", scen(workload={"phases": []}), "workload.phases")
scenario_case("workload-phase-repeated", scen(workload={"phases": ["decode", "decode"]}), "workload.phases")
scenario_case("workload-prefill-missing", scen(workload={"phases": ["prefill"]}), "prefill")
scenario_case("workload-requests-zero", scen(workload={"requests": 0}), "workload.requests")
scenario_case("workload-requests-word", scen(workload={"requests": "most"}), "workload.requests")
scenario_case("workload-requests-too-many", scen(workload={"requests": 33}), "workload.requests", "32")
scenario_case("workload-requests-unknown-id", scen(workload={"requests": [0, 99]}), "workload.requests", "99")
scenario_case("workload-requests-twice", scen(workload={"requests": [1, 1]}), "workload.requests", "twice")
scenario_case("workload-requests-empty", scen(workload={"requests": []}), "workload.requests")
scenario_case("workload-unknown", scen(workload={"batch": 2}), "workload.batch")
scenario_case("seed-negative", scen(seed=-1), "seed")
scenario_case("seed-frac", scen(seed=0.5), "seed")
scenario_case("seed-string", scen(seed="zero"), "seed")

# ---------------------------------------------------------------------------------------------
# trace files (read by `trace inspect` and `run`)
trace_case("not-parquet", lambda p: p.write_text("hello"), "Parquet")
trace_case("no-meta", lambda p: write_trace(p, small_table(), None), "moe_trace")
trace_case("meta-not-json", with_meta(lambda m: b"{nope"), "JSON")
trace_case("meta-version", with_meta(lambda m: m.update(version=2)), "version")
trace_case("meta-no-model", with_meta(lambda m: m.pop("model")), "model")
trace_case("meta-topk-gt-experts", with_meta(lambda m: m["model"].update(top_k=100)), "top_k")
trace_case("meta-layers-zero", with_meta(lambda m: m["model"].update(num_layers=0)), "num_layers")
trace_case("meta-layers-string", with_meta(lambda m: m["model"].update(num_layers="8")), "num_layers")
trace_case("missing-experts", drop_column("experts"), "experts")
trace_case("missing-layer", drop_column("layer"), "layer")
trace_case("experts-strings", mutate("experts", lambda v: [[str(x) for x in r] for r in v], pa.list_(pa.string())),
           "experts", "string")
trace_case("experts-floats", mutate("experts", lambda v: [[x + 0.5 for x in r] for r in v], pa.list_(pa.float32())),
           "experts", "float")
trace_case("experts-nested", mutate("experts", lambda v: [[r] for r in v], pa.list_(pa.list_(pa.int16()))),
           "experts")
trace_case("experts-scalar", mutate("experts", lambda v: [r[0] for r in v], pa.int16()), "experts")
trace_case("experts-out-of-range", mutate("experts", lambda v: at(v, 9, [64, 1, 2, 3, 4, 5])), "experts", "row 9")
trace_case("experts-short", mutate("experts", lambda v: at(v, 3, [1, 2])), "experts", "row 3")
trace_case("experts-duplicate", mutate("experts", lambda v: at(v, 5, [1, 1, 2, 3, 4, 5])), "experts", "row 5")
trace_case("experts-null", mutate("experts", lambda v: at(v, 7, None)), "experts", "row 7")
trace_case("request-strings", mutate("request_id", lambda v: [f"r{x}" for x in v], pa.string()), "request_id")
trace_case("request-floats", mutate("request_id", lambda v: [x + 0.5 for x in v], pa.float64()), "request_id")
trace_case("token-negative", renumber("token_idx", lambda x: x - 1), "token_idx")
def skip_token(t: pa.Table) -> pa.Table:
    """Request 0 jumps from token 1 to token 3 (rows 16 on of that request)."""
    tok, req = t.column("token_idx").to_pylist(), t.column("request_id").to_pylist()
    new = [x + (1 if i >= 16 and r == 0 else 0) for i, (x, r) in enumerate(zip(tok, req, strict=True))]
    return set_column(t, "token_idx", pa.array(new, pa.int32()))


trace_case("token-gap", rows(skip_token), "token_idx", "row 16")
trace_case("request-gap", renumber("request_id", lambda x: 2 * x), "request_id", "row 512")
trace_case("layer-out-of-range", mutate("layer", lambda v: at(v, 4, 9), pa.int16()), "layer", "row 4")
trace_case("layer-string", mutate("layer", lambda v: [str(x) for x in v], pa.string()), "layer")
trace_case("rows-out-of-order", rows(lambda t: pa.concat_tables([t.slice(8, 8), t.slice(0, 8), t.slice(16)])),
           "row 8")
trace_case("truncated-token", rows(lambda t: t.slice(0, 1020)), "missing layers")
trace_case("phase-unknown", mutate("phase", lambda v: at(v, 2, "prefil"), pa.string()), "phase", "row 2")
trace_case("phase-int", mutate("phase", lambda v: [1 for _ in v], pa.int8()), "phase")
trace_case("weights-strings", mutate("weights", lambda v: [[str(x) for x in r] for r in v], pa.list_(pa.string())),
           "weights")
trace_case("weights-negative", mutate("weights", lambda v: at(v, 11, [-0.5, 0.1, 0.1, 0.1, 0.1, 0.1])),
           "weights", "row 11", run=False)
trace_case("weights-nan", mutate("weights", lambda v: at(v, 12, [float("nan")] * 6)), "weights", "row 12", run=False)
trace_case("token-id-strings", mutate("token_id", lambda v: [str(x) for x in v], pa.string()), "token_id")
trace_case("unknown-column", rows(lambda t: t.append_column("expertz", pa.array([0] * t.num_rows))), "expertz")
trace_case("empty", rows(lambda t: t.slice(0, 0)), "no rows")

# ---------------------------------------------------------------------------------------------
# trace commands
case("inspect-missing", "trace inspect {tmp}/nope.parquet", "nope.parquet")
case("inspect-folder", "trace inspect {tmp}", "directory")
case("inspect-rows-negative", f"trace inspect {SAMPLE} --rows -1", "--rows")
case("stats-cache-sizes-word", f"trace stats {SAMPLE} --cache-sizes a,b", "--cache-sizes")
case("stats-cache-sizes-zero", f"trace stats {SAMPLE} --cache-sizes 0,4", "--cache-sizes")
case("stats-cache-sizes-over-e", f"trace stats {SAMPLE} --cache-sizes 65", "--cache-sizes", "64")
case("stats-missing", "trace stats {tmp}/nope.parquet", "nope.parquet")
case("synth-preset", "trace synth -o {tmp}/t.parquet --preset mixtral", "preset", "mixtral")
case("synth-requests-zero", "trace synth -o {tmp}/t.parquet --requests 0", "requests")
case("synth-set-unknown", "trace synth -o {tmp}/t.parquet --set requets=2", "requets")
case("synth-set-no-equals", "trace synth -o {tmp}/t.parquet --set requests", "requests", "KEY=VALUE")
case("synth-set-type", "trace synth -o {tmp}/t.parquet --set token_locality=high", "token_locality")
case("synth-set-range", "trace synth -o {tmp}/t.parquet --set token_locality=2", "token_locality")
case("synth-too-large", "trace synth -o {tmp}/t.parquet --preset mixtral-8x7b --requests 1000000 --decode-len 1000000",
     "rows")
case("synth-topk-over-experts", "trace synth -o {tmp}/t.parquet --set num_experts=4 --set top_k=8", "top_k")
case("synth-model-unknown", "trace synth -o {tmp}/t.parquet --set model=nope", "model", "nope")
case("synth-out-exists", "trace synth -o {tmp}/t.parquet --requests 1 --decode-len 2 --prompt-len 0",
     "t.parquet", "--force", files={"t.parquet": "mine"})
case("synth-out-parent-file", "trace synth -o {tmp}/f/t.parquet --requests 1", "f", files={"f": "x"})
case("synth-out-is-folder", "trace synth -o {tmp}/d --requests 1 --decode-len 2", "d", files={"d/x": "x"})
case("import-unknown-format", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from excel --model flame-moe-290m",
     "--from", "excel", files={"x.csv": "a\n"})
case("import-missing-source", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv --model flame-moe-290m",
     "x.csv")
case("import-no-model", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv", "--model", files={"x.csv": "a\n"})
case("import-out-exists", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv --model tiny --num-layers 2 "
     "--num-experts 4 --top-k 2", "t.parquet", "--force", files={"x.csv": (ROOT / "tests/data/traces/tiny.csv").read_text(), "t.parquet": "mine"})
case("record-no-torch-or-bad-hidden", ["trace", "record", "--model", "{tmp}/cfg.json", "--prompts", "{tmp}/p.txt",
                                       "-o", "{tmp}/t.parquet"], "hidden_size",
     files={"cfg.json": json.dumps({"model_type": "mixtral", "hidden_size": -4, "num_hidden_layers": 2,
                                     "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8,
                                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64}),
            "p.txt": "hello\n"}, needs="torch")
case("record-missing-prompts", "trace record --model {tmp}/cfg.json --prompts {tmp}/p.txt -o {tmp}/t.parquet",
     "p.txt", files={"cfg.json": "{}"}, needs="torch")
case("record-out-parent-file", "trace record --model {tmp}/cfg.json --prompts {tmp}/p.txt -o {tmp}/f/t.parquet",
     "f", files={"cfg.json": "{}", "p.txt": "hi\n", "f": "x"}, needs="torch")
case("record-columns", "trace record --model {tmp}/cfg.json --prompts {tmp}/p.txt -o {tmp}/t.parquet --columns logit",
     "--columns", "logit")

# ---------------------------------------------------------------------------------------------
# sweeps, comparisons, figures
SWEEP = "name: sw\nbase: {base}\ngrid:\n  cache.rate: [0.25, 0.5]\n"


def sweep_case(id: str, text: str, *culprit: str, extra: str = "") -> None:
    files: Files = {"s.yaml": scen(), "sw.yaml": text.replace("{base}", "s.yaml")}
    case(id, f"sweep {{tmp}}/sw.yaml --out {{tmp}}/o {extra}".strip(), *culprit, files=files)


sweep_case("sweep-bad-yaml", "grid: [\n", "sw.yaml", "line")
sweep_case("sweep-no-base", "name: sw\ngrid: {cache.rate: [0.5]}\n", "base")
sweep_case("sweep-base-missing", "name: sw\nbase: nope.yaml\ngrid: {cache.rate: [0.5]}\n", "nope.yaml")
sweep_case("sweep-unknown-key", "name: sw\nbase: {base}\ngird: {cache.rate: [0.5]}\n", "gird")
sweep_case("sweep-grid-unknown-path", "name: sw\nbase: {base}\ngrid: {cache.rat: [0.5]}\n", "cache.rat")
sweep_case("sweep-grid-bad-value", "name: sw\nbase: {base}\ngrid: {cache.rate: [0.5, 2]}\n", "cache.rate")
sweep_case("sweep-grid-empty", "name: sw\nbase: {base}\ngrid: {cache.rate: []}\n", "cache.rate")
sweep_case("sweep-grid-scalar", "name: sw\nbase: {base}\ngrid: {cache.rate: 0.5}\n", "cache.rate")
sweep_case("sweep-zip-lengths", "name: sw\nbase: {base}\nzip: {cache.rate: [0.5, 0.25], seed: [1]}\n", "zip")
sweep_case("sweep-policy-unknown", "name: sw\nbase: {base}\ngrid: {policy: [lru, lur]}\n", "lur")
sweep_case("sweep-duplicate-key", "name: sw\nbase: {base}\ngrid: {cache.rate: [0.5]}\ngrid: {seed: [1]}\n",
           "sw.yaml", "grid")
sweep_case("sweep-jobs-zero", SWEEP, "--jobs", extra="--jobs 0")
sweep_case("sweep-set-bad", SWEEP, "--set", extra="--set cache.rate")
sweep_case("sweep-dask-bad", SWEEP, "--dask", extra="--dask nowhere")
case("sweep-missing", "sweep {tmp}/nope.yaml", "nope.yaml")
case("sweep-out-is-file", "sweep {tmp}/sw.yaml --out {tmp}/f", "f",
     files={"s.yaml": scen(), "sw.yaml": SWEEP.replace("{base}", "s.yaml"), "f": "x"})
case("compare-format", "compare {tmp}/s.yaml --format xml", "--format", files={"s.yaml": scen()})
case("compare-metric", "compare {tmp}/s.yaml --metric speed", "--metric", files={"s.yaml": scen()})
case("compare-rates", "compare {tmp}/s.yaml --rates 0.5,half", "--rates", files={"s.yaml": scen()})
case("compare-rates-range", "compare {tmp}/s.yaml --rates 0.5,3", "cache.rate", files={"s.yaml": scen()})
case("compare-policy", "compare {tmp}/s.yaml -p lru,lur", "lur", files={"s.yaml": scen()})
case("compare-baseline", "compare {tmp}/s.yaml -p lru --rates 0.5 --baseline fifo --no-figure --out {tmp}/o",
     "--baseline", "fifo", files={"s.yaml": scen()})
case("compare-out-is-file", "compare {tmp}/s.yaml -p lru --rates 0.5 --out {tmp}/f", "f",
     files={"s.yaml": scen(), "f": "x"})
case("compare-missing", "compare {tmp}/nope.yaml", "nope.yaml")
case("plot-missing", "plot {tmp}/nope", "nope")
case("plot-not-parquet", "plot {tmp}/r.parquet", "r.parquet", files={"r.parquet": "x"})
case("plot-kind", "plot {tmp}/r.parquet --kind pie", "--kind", "pie", files={"r.parquet": "x"})
case("plot-empty-folder", "plot {tmp}/d", "d", files={"d/x.txt": "x"})


# ---------------------------------------------------------------------------------------------


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _make(root: Path, files: Files) -> None:
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(p)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 130
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if c.needs:
        pytest.importorskip(c.needs)
    _make(tmp_path, c.files)
    monkeypatch.chdir(tmp_path)          # default output folders (runs/...) land here too
    before = _tree(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in c.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err + out
    assert code == 2, f"exit {code}: {err}{out}"
    assert len(lines) == 1, err
    assert lines[0].startswith("simctl: error: ")
    for s in c.culprit:
        assert s in lines[0], f"{s!r} not named in {lines[0]!r}"
    assert _tree(tmp_path) == before, "the command left files behind"


def test_unwritable_out_as_non_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through permissions")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    scen_file = tmp_path / "s.yaml"
    scen_file.write_text(scen())
    try:
        code = main(["run", str(scen_file), "--out", str(locked / "o")])
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert code == 2 and "locked" in err and len(err.strip().splitlines()) == 1


def test_bad_utf8_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.yaml"
    text = scen()
    line = text.splitlines().index("policy: lru") + 1
    p.write_bytes(text.replace("policy: lru", "policy: l\udcffru").encode("utf-8", "surrogateescape"))
    assert main(["run", str(p)]) == 2
    assert f"line {line}" in capsys.readouterr().err
