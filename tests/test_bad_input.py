"""The bad-input corpus: every command, its options, scenario files and sweep files given input a
user could plausibly get wrong (trace files: ``tests/test_bad_traces.py``; what each case
asserts: ``tests/bad_input.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from moesim.sim.cli.main import main
from tests.bad_input import DELETE, QUICKSTART, SAMPLE, Case, Corpus, Files, check, scen
from tests.util import ROOT

CORPUS = Corpus()
case, scenario_case = CORPUS.case, CORPUS.scenario_case

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
case("run-out-not-empty", "run {tmp}/s.yaml --out {tmp}/o", "o", "moesim did not write",
     files={"s.yaml": scen(), "o/keep.txt": "mine"})
case("run-out-unwritable", "run {tmp}/s.yaml --out /proc/moesim-out", "/proc/moesim-out", files={"s.yaml": scen()})
case("run-timeline-without-out", "run {tmp}/s.yaml --timeline", "--timeline", "--out", files={"s.yaml": scen()})
case("policies-unknown", "policies lur", "lur")
case("schema-extra-argument", "schema quickstart.yaml", "quickstart.yaml")
case("models-extra-argument", "models mixtral", "mixtral")
case("trace-unknown-command", "trace summarize x.parquet", "summarize")
case("synth-params-extra-argument", "trace synth-params mixtral", "mixtral")
case("version-with-command", "--version --bogus", "--bogus")
case("hardware-unknown", "hardware rtx-5090x", "rtx-5090x")
case("hardware-missing-file", "hardware {tmp}/hw.yaml", "hw.yaml")
case("hardware-bad-yaml", "hardware {tmp}/hw.yaml", "hw.yaml", files={"hw.yaml": "pcie_gbps: [1,\n"})
case("hardware-bad-field", "hardware {tmp}/hw.yaml", "hw.yaml", "pcie_gbps",
     files={"hw.yaml": "hardware: {base: rtx-4090, pcie_gbps: fast}\n"})
case("calibrate-out-not-yaml", "calibrate -o {tmp}/p.txt --model flame-moe-290m", "p.txt", needs="torch")
case("calibrate-out-parent-file", "calibrate -o {tmp}/f/p.yaml --model flame-moe-290m", "f", files={"f": "x"}, needs="torch")
case("calibrate-out-exists", "calibrate -o {tmp}/p.yaml --model flame-moe-290m", "p.yaml", "moesim did not write",
     files={"p.yaml": "mine: 1\n"}, needs="torch")
case("calibrate-empty-model", "calibrate -o {tmp}/p.yaml --model \"\"", "--model", needs="torch")
case("calibrate-threads-0", "calibrate -o {tmp}/p.yaml --threads 0", "--threads")
case("validate-missing-scenario", "validate {tmp}/nope.yaml", "nope.yaml", needs="torch")
case("validate-missing-profile", "validate {tmp}/s.yaml --profile {tmp}/p.yaml", "p.yaml", files={"s.yaml": scen()}, needs="torch")
case("validate-out-not-empty", "validate {tmp}/s.yaml --out {tmp}/o", "o", "move it away",
     files={"s.yaml": scen(), "o/validation.json": "{}"}, needs="torch")
case("validate-bad-scenario", "validate {tmp}/s.yaml", "cache.rate", files={"s.yaml": scen(cache={"rate": 2})}, needs="torch")

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
scenario_case("runtime-kv-on-host-type", scen(runtime={"base": "llama-cpp-like", "kv_on_host": "maybe"}),
              "runtime.kv_on_host")
scenario_case("runtime-kv-on-host-eager", scen(runtime={"base": "hf-eager", "kv_on_host": True, "eager_score_bytes": 26}),
              "runtime", "kv_on_host", "eager_score_bytes")
scenario_case("runtime-kv-on-host-cpu-device", scen(hardware={"base": "rtx-4090", "device": "cpu"},
                                                 runtime={"base": "llama-cpp-like", "kv_on_host": True}),
              "runtime.kv_on_host", "device: cpu")
scenario_case("runtime-cpu-kernel-share", scen(runtime={"base": "hf-eager", "cpu_kernel": {"read_share": 1.5}}),
              "runtime.cpu_kernel.read_share")
scenario_case("runtime-cpu-kernel-call", scen(runtime={"base": "hf-eager", "cpu_kernel": {"call_us": -1}}),
              "runtime.cpu_kernel.call_us")
scenario_case("runtime-cpu-kernel-missing", scen(runtime={"cpu_kernel": {"call_us": 10}, "name": "x"}),
              "runtime.cpu_kernel.read_share")
scenario_case("runtime-numa-aware-type", scen(runtime={"base": "hf-eager", "numa_aware": "sometimes"}),
              "runtime.numa_aware")
scenario_case("cpu-numa-unaware-one-socket", scen(hardware={"base": "rtx-4090", "cpu": {"base": "xeon-spr-8ch",
                                                                                      "numa_unaware_gbps": 100}}),
              "numa_unaware_gbps", "one socket")
scenario_case("cpu-numa-unaware-above", scen(hardware={"base": "rtx-4090", "cpu": {"base": "xeon-platinum-8452y-2s",
                                                                                 "numa_unaware_gbps": 230}}),
              "numa_unaware_gbps", "exceeds mem_gbps")
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
scenario_case("cache-scope-unknown", scen(cache={"rate": 0.5, "scope": "pool"}), "cache.scope")
scenario_case("cache-scope-global-moepic", scen(cache={"rate": 0.5, "buffer_experts": 2, "scope": "global"},
                                                policy="moepic"), "moepic", "cache.scope")
scenario_case("cache-scope-global-lfru", scen(cache={"rate": 0.5, "scope": "global"}, policy="lfru"),
              "lfru", "cache.scope")
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
ALLOW = ["--allow-plugins"]
scenario_case("plugins-not-allowed", scen(plugins=["p.py"]), "p.py", "--allow-plugins", "MOESIM_ALLOW_PLUGINS",
              files={"p.py": "open('ran.txt', 'w').write('plugin code ran')\n"})   # the tree check: never ran
scenario_case("plugins-missing", scen(plugins=["nope.py"]), "nope.py", extra=ALLOW)
scenario_case("plugins-syntax", scen(plugins=["p.py"]), "p.py", "SyntaxError", files={"p.py": "def (:\n"}, extra=ALLOW)
scenario_case("plugins-raises", scen(plugins=["p.py"]), "p.py", "boom", files={"p.py": "raise RuntimeError('boom')\n"},
              extra=ALLOW)
scenario_case("plugins-scalar", scen(plugins="p.py"), "plugins")
scenario_case("plugins-registers-builtin", scen(plugins=["p.py"]), "p.py", "lru", files={"p.py": (
    "from moesim.policies.contract.base import Policy\nfrom moesim.policies.contract.registry import register\n"
    "@register\nclass Mine(Policy):\n    name = 'lru'\n")}, extra=ALLOW)
scenario_case("plugins-not-python", scen(plugins=["p.txt"]), "p.txt", files={"p.txt": "hello"}, extra=ALLOW)
scenario_case("plugins-param-not-stored", scen(plugins=["p.py"], policy={"name": "forgetful"}), "forgetful", "window",
              files={"p.py": (
                  "from moesim.policies.parts.caches import LRUCache\n"
                  "from moesim.policies.contract.registry import register\n"
                  "@register\nclass Forgetful(LRUCache):\n    name = 'forgetful'\n"
                  "    def __init__(self, *, window: int = 4) -> None:\n"
                  "        super().__init__()\n        self._window = window\n")}, extra=ALLOW)
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
     "t.parquet", "moesim did not write", files={"t.parquet": "mine"})
case("synth-out-parent-file", "trace synth -o {tmp}/f/t.parquet --requests 1", "f", files={"f": "x"})
case("synth-out-is-folder", "trace synth -o {tmp}/d --requests 1 --decode-len 2", "d", files={"d/x": "x"})
case("import-unknown-format", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from excel --model flame-moe-290m",
     "--from", "excel", files={"x.csv": "a\n"})
case("import-missing-source", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv --model flame-moe-290m",
     "x.csv")
case("import-no-model", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv", "--model", files={"x.csv": "a\n"})
case("import-out-exists", "trace import {tmp}/x.csv -o {tmp}/t.parquet --from csv --model tiny --num-layers 2 "
     "--num-experts 4 --top-k 2", "t.parquet", "moesim did not write", files={"x.csv": (ROOT / "tests/data/traces/tiny.csv").read_text(), "t.parquet": "mine"})
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
case("record-out-exists", "trace record --model {tmp}/cfg.json --prompts {tmp}/p.txt -o {tmp}/t.parquet",
     "t.parquet", "moesim did not write", files={"cfg.json": "{}", "p.txt": "hi\n", "t.parquet": "mine"}, needs="torch")
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
case("sweep-out-other-folder", "sweep {tmp}/sw.yaml --out {tmp}/o", "o", "moesim did not write",
     files={"s.yaml": scen(), "sw.yaml": SWEEP.replace("{base}", "s.yaml"), "o/notes.txt": "mine"})
case("compare-out-other-folder", "compare {tmp}/s.yaml -p lru --rates 0.5 --out {tmp}/o", "o", "moesim did not write",
     files={"s.yaml": scen(), "o/notes.txt": "mine"})
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


def test_the_corpus_is_large() -> None:
    from tests.test_bad_traces import CORPUS as TRACES

    everything = CORPUS.cases + TRACES.cases
    assert len(CORPUS.cases) >= 130 and len(everything) >= 150
    assert len({c.id for c in everything}) == len(everything)


@pytest.mark.parametrize("c", CORPUS.cases, ids=[c.id for c in CORPUS.cases])
def test_bad_input(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    check(c, tmp_path, monkeypatch, capsys)


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
