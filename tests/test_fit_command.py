"""``simctl fit``: a fit recovers values the measurements were generated with, held-out rows
never move it, its files work in scenarios (``calibration:``, ``hardware:``, ``runtime:``) with
the provenance in the summary and ``metrics.json``, and each bad input is one line."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.config.scenario import load_scenario_data, set_key
from moesim.sim.run.runner import run_loaded
from moesim.sim.study.fit import fit_measurements
from moesim.sim.study.fit_spec import load_measurements
from tests.bad_input import Case, check

BASE: dict[str, Any] = {
    "trace": {"synthetic": {"model": "mixtral-8x7b", "num_layers": 8, "requests": 2, "prompt_len": 4,
                            "decode_len": 8, "seed": 3}},
    "model": {"base": "mixtral-8x7b", "num_layers": 8},
    "runtime": "hf-eager",
    "cache": {"experts_per_layer": 4},
    "policy": "lru",
}
TRUE_LAYER_US = 2500.0
TRUE_PCIE = {"rtx-4090": 9.0, "a100-pcie-80gb": 17.0}
SETUPS = [  # (set, role)
    ({"hardware": "rtx-4090", "cache.experts_per_layer": 2}, "fit"),
    ({"hardware": "rtx-4090", "cache.experts_per_layer": 6}, "fit"),
    ({"hardware": "rtx-4090", "policy": "no-cache"}, "fit"),
    ({"hardware": "a100-pcie-80gb", "cache.experts_per_layer": 2}, "fit"),
    ({"hardware": "a100-pcie-80gb", "cache.experts_per_layer": 6}, "fit"),
    ({"hardware": "rtx-4090", "cache.experts_per_layer": 4}, "test"),
    ({"hardware": "a100-pcie-80gb", "policy": "no-cache"}, "test"),
]
FIT = {"runtime.layer_us": {"min": 100, "max": 20000},
       "hardware.pcie_gbps": {"min": 1, "max": 64, "per": "hardware"}}


def simulate(setup: dict[str, Any], values: dict[str, float]) -> dict[str, Any]:
    """The metrics of BASE with ``setup`` and ``values`` applied."""
    data = copy.deepcopy(BASE)
    for key, value in {**setup, **values}.items():
        set_key(data, key.split("."), value, key)
    metrics: dict[str, Any] = run_loaded(load_scenario_data(data, source="t", base_dir=Path(".")), steps=False).metrics
    return metrics


def measurement_doc() -> dict[str, Any]:
    """Measurements generated at TRUE_LAYER_US and TRUE_PCIE (6 significant digits)."""
    rows = []
    for setup, role in SETUPS:
        m = simulate(setup, {"runtime.layer_us": TRUE_LAYER_US, "hardware.pcie_gbps": TRUE_PCIE[setup["hardware"]]})
        rows.append({"set": setup, "tpot_ms": float(f"{m['tpot_ms']['mean']:.6g}"), "role": role,
                     "source": f"generated: {json.dumps(setup)}"})
    return {"name": "known-values", "source": "the simulator at known values", "base": BASE, "fit": FIT, "rows": rows}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return measurement_doc()


@pytest.fixture(scope="module")
def fitted(doc: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``simctl fit`` of the generated measurements: its --out folder."""
    tmp = tmp_path_factory.mktemp("fit")
    (tmp / "m.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["fit", str(tmp / "m.yaml"), "--out", str(tmp / "out"), "--jobs", "1"]) == 0
    return tmp / "out"


def values_of(out: Path) -> dict[str, float]:
    data = yaml.safe_load((out / "fitted.yaml").read_text())
    return {f"{p['key']}[{p['group']}]": p["value"] for p in data["parameters"]}


def csv_rows(out: Path) -> list[dict[str, str]]:
    with (out / "rows.csv").open() as f:
        return list(csv.DictReader(f))


def test_recovers_the_values_the_measurements_came_from(fitted: Path) -> None:
    values = values_of(fitted)
    assert set(values) == {"runtime.layer_us[None]", "hardware.pcie_gbps[rtx-4090]",
                           "hardware.pcie_gbps[a100-pcie-80gb]"}
    assert values["runtime.layer_us[None]"] == pytest.approx(TRUE_LAYER_US, rel=0.03)
    for hw, bw in TRUE_PCIE.items():
        assert values[f"hardware.pcie_gbps[{hw}]"] == pytest.approx(bw, rel=0.03)
    rows = csv_rows(fitted)
    assert [r["role"] for r in rows] == [role for _, role in SETUPS]
    assert {r["metric"] for r in rows} == {"tpot_ms"}
    for r in rows:   # the truth is in the model's reach: every row, held out or not, is predicted
        assert float(r["ratio"]) == pytest.approx(1, abs=0.02)
        assert float(r["predicted"]) / float(r["measured"]) == pytest.approx(float(r["ratio"]), rel=1e-5)
    doc = yaml.safe_load((fitted / "fitted.yaml").read_text())
    assert doc["fit"]["fit_rows"] == 5 and doc["fit"]["test_rows"] == 2
    assert doc["fit"]["held_out"]["rows"] == 2 and doc["fit"]["held_out"]["max_ratio"] < 1.02
    assert doc["fit"]["leave_one_out"]["rows"] == 5
    assert (fitted / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_held_out_rows_never_move_the_fit(doc: dict[str, Any], tmp_path: Path) -> None:
    results = []
    for factor in (1.0, 3.0):
        d = copy.deepcopy(doc)
        for row in d["rows"]:
            if row["role"] == "test":
                row["tpot_ms"] *= factor
        (tmp_path / "m.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
        results.append(fit_measurements(load_measurements(tmp_path / "m.yaml"), jobs=1, loo="none"))
    a, b = results
    assert [v.value for v in a.values] == [v.value for v in b.values]
    assert a.predicted == b.predicted
    assert a.held_out is not None and b.held_out is not None
    assert b.held_out.max_ratio is not None and b.held_out.max_ratio > 2.5   # the changed rows are judged


def test_two_worker_processes_give_the_same_fit(doc: dict[str, Any], fitted: Path, tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = fit_measurements(load_measurements(tmp_path / "m.yaml"), jobs=2)   # grid, groups and refits in workers
    assert {f"{v.free.key}[{v.free.group}]": v.value for v in res.values} == values_of(fitted)
    assert [f"{p:.6f}" for p in res.predicted] == [f"{float(r['predicted']):.6f}" for r in csv_rows(fitted)]
    assert [None if p is None else round(p, 6) for p in res.loo_predicted] == [
        None if not r["loo_predicted"] else float(r["loo_predicted"]) for r in csv_rows(fitted)]


@pytest.mark.parametrize("method", ["refit", "one-step"])
def test_leave_one_out_predicts_each_fit_row(doc: dict[str, Any], tmp_path: Path, method: Any) -> None:
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = fit_measurements(load_measurements(tmp_path / "m.yaml"), jobs=1, loo=method)
    assert res.loo_error is not None and res.loo_error.rows == 5
    for lp, m in zip(res.loo_predicted, res.measures, strict=True):
        assert (lp is None) == (m.row.role == "test")
        assert lp is None or lp / m.measured == pytest.approx(1, abs=0.03)


def test_a_group_with_one_fit_row_has_no_leave_one_out(doc: dict[str, Any], tmp_path: Path) -> None:
    d = copy.deepcopy(doc)
    d["rows"] = [r for r in d["rows"] if not (r["set"]["hardware"] == "a100-pcie-80gb" and r["role"] == "fit")][:3]
    d["rows"].append(next(r for r in doc["rows"] if r["set"]["hardware"] == "a100-pcie-80gb" and r["role"] == "fit"))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    res = fit_measurements(load_measurements(tmp_path / "m.yaml"), jobs=1)
    lone = [lp for lp, m in zip(res.loo_predicted, res.measures, strict=True) if m.row.groups["hardware"] == "a100-pcie-80gb"]
    assert lone == [None]
    assert res.loo_error is not None and res.loo_error.rows == 3


def test_ratio_rows_divide_by_their_reference(doc: dict[str, Any], tmp_path: Path) -> None:
    truth = {"runtime.layer_us": TRUE_LAYER_US, "hardware.pcie_gbps": TRUE_PCIE["rtx-4090"]}
    ratio = (simulate({"hardware": "rtx-4090", "policy": "no-cache"}, truth)["tpot_ms"]["mean"]
             / simulate({"hardware": "rtx-4090", "cache.experts_per_layer": 6}, truth)["tpot_ms"]["mean"])
    d = copy.deepcopy(doc)
    d["notes"] = "free text"
    d["rows"].append({"set": {"hardware": "rtx-4090", "policy": "no-cache"},
                      "relative_to": {"policy": "lru", "cache.experts_per_layer": 6},
                      "tpot_ms": round(ratio, 6), "role": "test", "read_off": True})
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    res = fit_measurements(load_measurements(tmp_path / "m.yaml"), jobs=1, loo="none")
    assert res.measures[-1].row.read_off and res.measures[-1].row.relative_to
    assert ratio > 1.5 and res.predicted[-1] == pytest.approx(ratio, rel=0.02)


def test_an_empty_fit_only_predicts(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy.deepcopy(doc)
    d["fit"] = {}
    d["base"] = {**d["base"], "runtime": {"base": "hf-eager", "layer_us": TRUE_LAYER_US},
                 "hardware": {"base": "rtx-4090", "pcie_gbps": TRUE_PCIE["rtx-4090"]}}
    d["rows"] = [r for r in d["rows"] if r["set"].pop("hardware") == "rtx-4090"]   # the base's hardware
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    assert main(["fit", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    assert "nothing fitted" in capsys.readouterr().out
    rows = csv_rows(tmp_path / "out")
    assert len(rows) == len(d["rows"]) and all(float(r["ratio"]) == pytest.approx(1, abs=1e-4) for r in rows)
    assert yaml.safe_load((tmp_path / "out" / "fitted.yaml").read_text())["parameters"] == []


def scenario(tmp_path: Path, setup: dict[str, Any], **keys: Any) -> Path:
    data = copy.deepcopy(BASE)
    for key, value in setup.items():
        set_key(data, key.split("."), value, key)
    data.update(keys)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def run_json(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["run", str(path), "--json", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_calibration_gives_the_predicted_values(fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for (setup, _), row in zip(SETUPS, csv_rows(fitted), strict=True):
        m = run_json(scenario(tmp_path, setup, calibration=str(fitted / "fitted.yaml")), capsys)
        assert m["tpot_ms"]["mean"] == pytest.approx(float(row["predicted"]), rel=1e-5)
        (prov,) = m["fit"]
        assert prov["name"] == "known-values" and prov["via"] == "calibration"
        assert prov["group"] == {"hardware": setup["hardware"]}
        assert prov["held_out"]["rows"] == 2 and prov["fit_rows"] == 5
        assert set(prov["values"]) == {"runtime.layer_us", "hardware.pcie_gbps"}


def test_calibration_fills_a_missing_runtime_from_the_fit(fitted: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    setup, _ = SETUPS[0]
    path = scenario(tmp_path, setup, calibration=str(fitted / "fitted.yaml"))
    data = yaml.safe_load(path.read_text())
    del data["runtime"]
    path.write_text(yaml.safe_dump(data))
    m = run_json(path, capsys)
    assert m["tpot_ms"]["mean"] == pytest.approx(float(csv_rows(fitted)[0]["predicted"]), rel=1e-5)
    assert m["fit"][0]["context"] == {"runtime": "hf-eager"}


def test_runtime_section_and_summary_and_metrics_json(fitted: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((fitted / "fitted.yaml").read_text())
    assert "hardware" not in doc     # two hardware: no single hardware section
    assert doc["runtime"]["layer_us"] == values_of(fitted)["runtime.layer_us[None]"]
    setup, _ = SETUPS[1]
    pcie = values_of(fitted)["hardware.pcie_gbps[rtx-4090]"]
    path = scenario(tmp_path, setup, runtime=str(fitted / "fitted.yaml"),
                    hardware={"base": "rtx-4090", "pcie_gbps": pcie})
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    summary = capsys.readouterr().out
    assert "fitted" in summary and "known-values" in summary and "held-out 2 rows" in summary
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["tpot_ms"]["mean"] == pytest.approx(float(csv_rows(fitted)[1]["predicted"]), rel=1e-5)
    (prov,) = metrics["fit"]
    assert prov["via"] == "runtime" and set(prov["values"]) == {"runtime.layer_us"}
    # the written config.yaml runs the same scenario again
    again = run_json(tmp_path / "run" / "config.yaml", capsys)
    assert again["tpot_ms"] == metrics["tpot_ms"] and again["fit"] == metrics["fit"]


def test_one_hardware_fit_is_a_hardware_file(doc: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = copy.deepcopy(doc)
    d["rows"] = [r for r in d["rows"] if r["set"]["hardware"] == "rtx-4090"]
    d["fit"] = {"hardware.pcie_gbps": {"min": 1, "max": 64, "per": "hardware"}}
    d["base"] = {**d["base"], "runtime": {"base": "hf-eager", "layer_us": TRUE_LAYER_US}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    assert main(["fit", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    hw = yaml.safe_load((tmp_path / "out" / "fitted.yaml").read_text())["hardware"]
    assert hw["pcie_gbps"] == pytest.approx(TRUE_PCIE["rtx-4090"], rel=0.03)
    assert "known-values" in hw["sources"]["pcie_gbps"]
    capsys.readouterr()
    assert main(["hardware", str(tmp_path / "out" / "fitted.yaml")]) == 0
    shown = capsys.readouterr().out
    assert "known-values" in shown and "pcie_gbps" in shown and "held-out" in shown
    setup, _ = SETUPS[5]
    path = scenario(tmp_path, setup, hardware=str(tmp_path / "out" / "fitted.yaml"),
                    runtime={"base": "hf-eager", "layer_us": TRUE_LAYER_US})
    m = run_json(path, capsys)
    predicted = next(r for r in csv_rows(tmp_path / "out") if r["role"] == "test")["predicted"]
    assert m["tpot_ms"]["mean"] == pytest.approx(float(predicted), rel=1e-5)
    assert m["fit"][0]["via"] == "hardware"


# --- bad input: one line naming the culprit, exit 2, nothing written ------------------------------
def mfile(change: Any = None, **top: Any) -> str:
    """A small valid measurement file (3 rows, 2 free values), with ``change(doc)`` applied."""
    d: dict[str, Any] = {"name": "bad", "source": "test", "base": BASE,
                         "fit": {"runtime.layer_us": {"min": 100, "max": 20000}, "hardware.pcie_gbps": {"min": 1, "max": 64}},
                         "rows": [{"set": {"hardware": "rtx-4090", "cache.experts_per_layer": e}, "tpot_ms": 100.0 + e}
                                  for e in (2, 4, 6)]}
    d.update(top)
    if change is not None:
        change(d)
    return yaml.safe_dump(d, sort_keys=False)


def _set(path: str, value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        node: Any = d
        parts = path.split("/")
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node[p]
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


FIT_CASES = [
    Case("fit-missing-file", ["fit", "{tmp}/nope.yaml", "--out", "{tmp}/o"], ["nope.yaml"]),
    Case("fit-bad-yaml", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["m.yaml", "line"], {"m.yaml": "name: [x\n"}),
    Case("fit-top-list", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["m.yaml", "mapping"], {"m.yaml": "- a\n"}),
    Case("fit-unknown-top-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["m.yaml", "rowz"],
         {"m.yaml": mfile(rowz=[])}),
    Case("fit-unknown-fit-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["m.yaml", "runtime.layr_us", "layer_us"],
         {"m.yaml": mfile(_set("fit/runtime.layr_us", {"min": 1, "max": 2}))}),
    Case("fit-unknown-set-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[1]", "cache.experts"],
         {"m.yaml": mfile(_set("rows/1/set", {"hardware": "rtx-4090", "cache.experts": 2}))}),
    Case("fit-min-not-below-max", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["fit.runtime.layer_us", "min"],
         {"m.yaml": mfile(_set("fit/runtime.layer_us", {"min": 500, "max": 100}))}),
    Case("fit-start-outside-bounds", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["fit.runtime.layer_us", "start"],
         {"m.yaml": mfile(_set("fit/runtime.layer_us", {"min": 100, "max": 200, "start": 5000}))}),
    Case("fit-bound-not-positive", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["fit.hardware.pcie_gbps.min"],
         {"m.yaml": mfile(_set("fit/hardware.pcie_gbps", {"min": 0, "max": 64}))}),
    Case("fit-unknown-metric", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0]", "tpot", "metrics.json"],
         {"m.yaml": mfile(_set("rows/0", {"set": {"hardware": "rtx-4090"}, "tpot": 3.0}))}),
    Case("fit-measured-not-positive", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[2]", "tpot_ms"],
         {"m.yaml": mfile(_set("rows/2/tpot_ms", -4))}),
    Case("fit-row-does-not-run", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[1]", "experts_per_layer"],
         {"m.yaml": mfile(_set("rows/1/set", {"hardware": "rtx-4090", "cache.experts_per_layer": 100}))}),
    Case("fit-row-unknown-policy", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0]", "lruu"],
         {"m.yaml": mfile(_set("rows/0/set", {"hardware": "rtx-4090", "policy": "lruu"}))}),
    Case("fit-row-sets-fitted-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0]", "runtime.layer_us"],
         {"m.yaml": mfile(_set("rows/0/set", {"hardware": "rtx-4090", "runtime.layer_us": 5}))}),
    Case("fit-too-many-values", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["3 free values", "2 fit measurements"],
         {"m.yaml": mfile(lambda d: (d["rows"].__setitem__(2, {**d["rows"][2], "role": "test"}),
                                     d["fit"].__setitem__("hardware.peak_tflops", {"min": 10, "max": 1000})))}),
    Case("fit-group-underdetermined", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"],
         ["2 free values", "hardware=t4", "1 fit measurement"],
         {"m.yaml": mfile(lambda d: (d["fit"]["hardware.pcie_gbps"].__setitem__("per", "hardware"),
                                     d["fit"]["runtime.layer_us"].__setitem__("per", "hardware"),
                                     d["rows"].append({"set": {"hardware": "t4"}, "tpot_ms": 9.0})))}),
    Case("fit-group-without-fit-row", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["fit.hardware.pcie_gbps", "t4"],
         {"m.yaml": mfile(lambda d: (d["fit"]["hardware.pcie_gbps"].__setitem__("per", "hardware"),
                                     d["rows"].append({"set": {"hardware": "t4"}, "tpot_ms": 9.0, "role": "test"})))}),
    Case("fit-relative-to-fitted-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].relative_to", "runtime.layer_us"],
         {"m.yaml": mfile(_set("rows/0/relative_to", {"runtime.layer_us": 5}))}),
    Case("fit-relative-to-unknown-key", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[1].relative_to", "polcy"],
         {"m.yaml": mfile(_set("rows/1/relative_to", {"polcy": "lru"}))}),
    Case("fit-bad-role", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["rows[0].role"],
         {"m.yaml": mfile(_set("rows/0/role", "train"))}),
    Case("fit-base-missing-file", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["base", "nope.yaml"],
         {"m.yaml": mfile(base="nope.yaml")}),
    Case("fit-out-not-empty", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o"], ["--out", "moesim did not write"],
         {"m.yaml": mfile(), "o/keep.txt": "mine"}),
    Case("fit-loo-bad", ["fit", "{tmp}/m.yaml", "--out", "{tmp}/o", "--loo", "all"], ["--loo"], {"m.yaml": mfile()}),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=lambda c: c.id)
def test_bad_fit_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    case.argv = [*case.argv, "--jobs", "1"]
    check(case, tmp_path, monkeypatch, capsys)


def _fitted_file(tmp_path: Path) -> Path:
    """A minimal valid fitted file with pcie_gbps fitted per hardware for rtx-4090 only."""
    doc = {"fit": {"name": "f", "source": "s", "measurements": "/m.yaml", "fit_rows": 2, "test_rows": 0,
                   "fit_error": {"rows": 2, "median_abs_error_pct": 1.0, "max_ratio": 1.01, "within_1_5x": 2}},
           "parameters": [{"key": "hardware.pcie_gbps", "value": 9.0, "per": "hardware", "group": "rtx-4090",
                           "min": 1, "max": 64}]}
    p = tmp_path / "fitted.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _scen(**keys: Any) -> str:
    data = copy.deepcopy(BASE)
    data.update({"hardware": "rtx-4090", "calibration": "fitted.yaml", **keys})
    return yaml.safe_dump(data)


def test_bad_calibration_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fitted = _fitted_file(tmp_path).read_text()
    cases = [
        Case("calibration-missing", ["run", "{tmp}/s.yaml"], ["calibration", "fitted.yaml"], {"s.yaml": _scen()}),
        Case("calibration-other-group", ["run", "{tmp}/s.yaml"], ["calibration", "t4", "rtx-4090"],
             {"s.yaml": _scen(hardware="t4"), "fitted.yaml": fitted}),
        Case("calibration-conflict", ["run", "{tmp}/s.yaml"], ["hardware.pcie_gbps", "3"],
             {"s.yaml": _scen(hardware={"base": "rtx-4090", "pcie_gbps": 3}), "fitted.yaml": fitted}),
        Case("calibration-not-a-fit", ["run", "{tmp}/s.yaml"], ["calibration", "fitted.yaml", "simctl fit"],
             {"s.yaml": _scen(), "fitted.yaml": "hardware: {base: rtx-4090}\n"}),
        Case("calibration-on-hardware-file", ["run", "{tmp}/s.yaml"], ["hardware", "hw.yaml"],
             {"s.yaml": _scen(hardware="hw.yaml"), "fitted.yaml": fitted, "hw.yaml": "hardware: {base: rtx-4090}\n"}),
        Case("fitted-as-hardware-without-section", ["run", "{tmp}/s.yaml"], ["fitted.yaml", "calibration"],
             {"s.yaml": _scen(hardware="fitted.yaml", calibration=None), "fitted.yaml": fitted}),
    ]
    for case in cases:
        sub = tmp_path / case.id
        sub.mkdir()
        check(case, sub, monkeypatch, capsys)


def test_set_wins_over_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fitted_file(tmp_path)
    (tmp_path / "s.yaml").write_text(_scen())
    calibrated = run_json(tmp_path / "s.yaml", capsys)
    assert calibrated["fit"][0]["values"] == {"hardware.pcie_gbps": 9.0}
    overridden = run_json(tmp_path / "s.yaml", capsys, "--set", "hardware.pcie_gbps=30")
    assert overridden["fit"][0]["values"] == {}
    assert overridden["tpot_ms"]["mean"] < calibrated["tpot_ms"]["mean"]


def test_a_fit_records_its_measurement_file_relative_to_where_it_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moesim.sim.study.fit_output import shown_path

    (tmp_path / "measurements").mkdir()
    f = tmp_path / "measurements" / "set.yaml"
    f.write_text("name: set\n")
    monkeypatch.chdir(tmp_path)
    assert shown_path(Path("measurements/set.yaml")) == "measurements/set.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert shown_path(f) == str(f.resolve())   # not below the working directory: absolute
