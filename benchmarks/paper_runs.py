"""Shared by the paper-reproduction scripts (``activeevict_table.py``, ``fmoe_table.py``): run a
scenario given as a mapping with a policy object kept, so that a script can read the policy's
own counters (pre-evictions, regrets, matches) beside the metrics."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from moesim.policies.contract.base import Policy
from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.run.runner import load_trace, prepare_run
from moesim.traces.format.trace_file import Trace

ROOT = Path(__file__).resolve().parents[1]


@cache
def _trace(data_json: str) -> Trace:
    data = json.loads(data_json)
    return load_trace(load_scenario_data(data, source="trace", base_dir=ROOT))


def run_scenario(data: dict[str, Any]) -> tuple[dict[str, Any], Policy]:
    """Run the scenario ``data`` (as a YAML file would hold it); returns (metrics, policy)."""
    loaded = load_scenario_data(data, source=data.get("name", "scenario"), base_dir=ROOT)
    tr = _trace(json.dumps({"trace": loaded.scenario.trace, "hardware": "h20", "cache": {"rate": 1},
                            "policy": "lru"}, sort_keys=True))
    prep = prepare_run(loaded, trace=tr, steps=False)
    return prep.run().metrics, prep.policy
