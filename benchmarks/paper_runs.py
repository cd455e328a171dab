"""Shared by the paper-reproduction scripts (``activeevict_table.py``, ``fmoe_table.py``): run a
scenario given as a mapping with a policy object kept, so that a script can read the policy's
own counters (pre-evictions, regrets, matches) beside the metrics."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from moesim.policies.base import Policy
from moesim.policies.registry import make_policy
from moesim.sim.cost import CostModel
from moesim.sim.engine import Engine
from moesim.sim.metrics import compute_metrics
from moesim.sim.runner import load_trace, split_profile
from moesim.sim.scenario import load_scenario_data
from moesim.sim.workload import build_workload
from moesim.traces.format import Trace

ROOT = Path(__file__).resolve().parents[1]


@cache
def _trace(data_json: str) -> Trace:
    data = json.loads(data_json)
    return load_trace(load_scenario_data(data, source="trace", base_dir=ROOT))


def run_scenario(data: dict[str, Any]) -> tuple[dict[str, Any], Policy]:
    """Run the scenario ``data`` (as a YAML file would hold it); returns (metrics, policy)."""
    loaded = load_scenario_data(data, source=data.get("name", "scenario"), base_dir=ROOT)
    scen = loaded.scenario
    tr = _trace(json.dumps({"trace": scen.trace, "hardware": "h20", "cache": {"rate": 1},
                            "policy": "lru"}, sort_keys=True))
    model = loaded.model_spec(tr.model.name)
    spec = scen.policy_spec
    policy = make_policy(spec.name, spec.params)
    profile, remaining = split_profile(loaded, tr)
    wl = build_workload(tr, batch_size=scen.workload.batch_size, phases=scen.workload.phases,
                        requests=remaining if profile is not None else "all")
    eng = Engine(wl, policy, CostModel(model, loaded.hardware_spec(), loaded.runtime_spec()),
                 budget_bytes=scen.cache.budget_bytes(model),
                 buffer_bytes=int(round(scen.cache.buffer_experts * model.expert_bytes)),
                 initial=scen.cache.initial, swap_out=scen.cache.swap_out, pcie_order=scen.pcie.order,
                 sync_prefetch=scen.pcie.sync_prefetch, seed=scen.seed, profile=profile, record_steps=False)
    eng.run()
    return compute_metrics(eng), policy
