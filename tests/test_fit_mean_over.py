"""``mean_over`` rows of a measurement file (a published mean over several setups, such as fMoE's
three-model averages): the prediction is the mean of the metric over the setups, of a ratio row
the mean of the row's runs over the mean of the references' (the ratio of the means), each
setup applied after the row's ``set``; a bad ``mean_over`` is one line naming the row."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from moesim.sim.study.fit import fit_measurements
from moesim.sim.study.fit_spec import load_measurements
from tests.bad_input import Case, check
from tests.test_fit_command import BASE, TRUE_LAYER_US, TRUE_PCIE, simulate

FIXED = {"runtime": {"base": "hf-eager", "layer_us": TRUE_LAYER_US},
         "hardware": {"base": "rtx-4090", "pcie_gbps": TRUE_PCIE["rtx-4090"]}}
SETUPS = [{"cache.experts_per_layer": 2}, {"cache.experts_per_layer": 6}]


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "means", "source": "test", "base": {**copy.deepcopy(BASE), **FIXED}, "fit": {}, "rows": rows}


def _tpot(setup: dict[str, Any]) -> float:
    return float(simulate({"hardware": "rtx-4090", **setup}, {"runtime.layer_us": TRUE_LAYER_US,
                                  "hardware.pcie_gbps": TRUE_PCIE["rtx-4090"]})["tpot_ms"]["mean"])


def test_a_mean_row_predicts_the_mean_and_a_ratio_row_the_ratio_of_the_means(tmp_path: Path) -> None:
    own = [_tpot({"policy": "no-cache", **s}) for s in SETUPS]
    ref = [_tpot({"policy": "lru", **s}) for s in SETUPS]
    rows = [{"set": {"policy": "no-cache"}, "mean_over": SETUPS, "tpot_ms": 1.0, "role": "test"},
            {"set": {"policy": "no-cache"}, "relative_to": {"policy": "lru"}, "mean_over": SETUPS,
             "tpot_ms": 1.0, "role": "test"},
            {"set": {"policy": "no-cache", **SETUPS[1]}, "relative_to": {"policy": "lru"}, "tpot_ms": 1.0,
             "role": "test"}]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(_doc(rows), sort_keys=False))
    ms = load_measurements(tmp_path / "m.yaml")
    assert [len(r.variants) for r in ms.rows] == [2, 2, 0]
    assert ms.rows[1].label.endswith("(mean over 2 setups)")
    res = fit_measurements(ms, jobs=1, loo="none")
    assert res.predicted[0] == math.fsum(own) / 2
    ratio_of_means = (math.fsum(own) / 2) / (math.fsum(ref) / 2)
    assert res.predicted[1] == ratio_of_means
    assert ratio_of_means != pytest.approx(math.fsum(o / r for o, r in zip(own, ref, strict=True)) / 2, rel=1e-3)
    assert res.predicted[2] == own[1] / ref[1]   # a row without mean_over: one run each, as before


def _bad(change: dict[str, Any]) -> str:
    row = {"set": {"policy": "no-cache"}, "relative_to": {"policy": "lru"}, "tpot_ms": 1.0, "role": "test", **change}
    return yaml.safe_dump(_doc([row]), sort_keys=False)


PER_HARDWARE = yaml.safe_dump({
    "name": "means", "source": "test", "base": copy.deepcopy(BASE),
    "fit": {"hardware.pcie_gbps": {"min": 1, "max": 64, "per": "hardware"}},
    "rows": [{"set": {"policy": "lru"}, "mean_over": [{"hardware": "rtx-4090"}, {"hardware": "a100-pcie-80gb"}],
              "tpot_ms": 1.0, "role": "fit"}]}, sort_keys=False)

MEAN_CASES = [
    Case("fit-mean-over-across-groups", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0]", "differ in hardware"],
         {"m.yaml": PER_HARDWARE}),
    Case("fit-mean-over-empty", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].mean_over", "empty"],
         {"m.yaml": _bad({"mean_over": []})}),
    Case("fit-mean-over-empty-setup", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].mean_over[1]", "empty"],
         {"m.yaml": _bad({"mean_over": [SETUPS[0], {}]})}),
    Case("fit-mean-over-repeats-set", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].mean_over[0]", "policy"],
         {"m.yaml": _bad({"mean_over": [{"policy": "lru"}, SETUPS[1]]})}),
    Case("fit-mean-over-unknown-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].mean_over[1]", "cache.expert"],
         {"m.yaml": _bad({"mean_over": [SETUPS[0], {"cache.expert": 3}]})}),
    Case("fit-mean-over-not-a-list", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].mean_over"],
         {"m.yaml": _bad({"mean_over": {"cache.experts_per_layer": 2}})}),
]


@pytest.mark.parametrize("case", MEAN_CASES, ids=lambda c: c.id)
def test_bad_mean_over(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    case.argv = [*case.argv, "--jobs", "1"]
    check(case, tmp_path, monkeypatch, capsys)
