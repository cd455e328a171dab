"""Golden outputs in CI: the runs of ``tests/data/golden_ci.json`` (every shipped scenario as
it is, and every registered policy on a trimmed tiny scenario under each engine option, chosen by
``benchmarks/golden_ci.py --select`` to reach every engine path) reproduce their committed
digests of metrics and step records, bit for bit. The full comparison (every scenario x every
policy) stays in ``benchmarks/golden_outputs.py``."""

from __future__ import annotations

import pytest

from benchmarks.golden_ci import (
    OWN,
    REGENERATE,
    TABLE,
    differences,
    load_table,
    scenario_files,
    split_key,
)
from moesim.policies.contract.registry import policy_class, policy_names

TABLE_NAME = TABLE.relative_to(TABLE.parents[2]).as_posix()


def test_the_table_reaches_every_scenario_policy_and_engine_path() -> None:
    runs = load_table()
    assert {split_key(k)[0] for k in runs if split_key(k)[1] == OWN} == set(scenario_files()), (
        f"a shipped scenario has no run in {TABLE_NAME} (or the table names one that is gone): "
        f"`python benchmarks/golden_ci.py --select`")
    shipped = {n for n in policy_names() if policy_class(n).__module__.startswith("moesim.policies.")}   # not plugins
    missing = shipped - {r["policy"] for r in runs.values()}
    assert not missing, f"policies without a run in {TABLE_NAME}: {sorted(missing)}: `python benchmarks/golden_ci.py --select`"
    paths = {r["engine_path"] for r in runs.values()}
    assert "event" in paths and len(paths) > 2, paths
    assert all(not r["digest"].startswith(("ERR:", "EXC:")) for r in runs.values())


def test_golden_outputs_are_reproduced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOESIM_ALLOW_PLUGINS", "1")   # scenarios/plugin-example.yaml loads a plugin
    runs = load_table()
    diff = differences(runs)
    assert not diff, (
        f"{len(diff)} of the {len(runs)} golden runs of {TABLE_NAME} differ from this tree's outputs:\n"
        + "\n".join(diff)
        + f"\nIf the change of outputs is intended, run `{REGENERATE}` and commit the table (compare the "
        "whole set first: benchmarks/golden_outputs.py); otherwise the change altered what runs compute.")
