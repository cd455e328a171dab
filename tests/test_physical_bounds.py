"""Physical bounds: every catalog hardware entry names its PCIe generation and holds no copy
rate beyond that link's theoretical rate; a fit lowers a declared bound to what physics allows
(the link, the measured step over the layers), writes where it comes from, and a value pressed
against a bound names the cost the data seems to ask for."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from moesim.sim.config.catalog import get_hardware, hardware_names
from moesim.sim.config.catalog.physics import PCIE_X16_GBPS, link_limit_gbps
from moesim.sim.study.fit import fit_measurements
from moesim.sim.study.fit_bounds import missing_cost, physical_bound, step_us
from moesim.sim.study.fit_output import fitted_document
from moesim.sim.study.fit_spec import FitError, load_measurements


@pytest.mark.parametrize("name", hardware_names())
def test_catalog_entry_within_physics(name: str) -> None:
    hw = get_hardware(name)
    if hw.device == "cpu":
        return
    assert hw.pcie_gen is not None, f"{name}: no pcie_gen (its link's generation bounds its copy rates)"
    assert "pcie_gen" in hw.sources, f"{name}: pcie_gen has no source"
    link = hw.link_gbps
    assert link is not None
    assert hw.pcie_gbps <= link, f"{name}: pcie_gbps {hw.pcie_gbps} beyond PCIe {hw.pcie_gen}.0's {link} GB/s"
    assert hw.pageable_rate_gbps <= hw.pcie_gbps, f"{name}: pageable faster than pinned"
    assert (hw.d2h_gbps or hw.pcie_gbps) <= link, f"{name}: d2h_gbps beyond the link"


def test_link_limits() -> None:
    assert PCIE_X16_GBPS == {3: 15.75, 4: 31.5, 5: 63.0}
    assert link_limit_gbps(4, 8) == 15.75
    with pytest.raises(ValueError, match="PCIe generation 6"):
        link_limit_gbps(6)
    assert step_us("tpot_ms", 2.5) == 2500.0 and step_us("tokens_per_s", 4.0) == 250000.0
    assert step_us("hit_rate", 0.5) is None


BASE: dict[str, Any] = {
    "trace": {"synthetic": {"model": "mixtral-8x7b", "num_layers": 4, "requests": 1, "prompt_len": 4,
                            "decode_len": 6, "seed": 3}},
    "model": {"base": "mixtral-8x7b", "num_layers": 4},
    "runtime": {"base": "hf-eager"},
    "cache": {"experts_per_layer": 4},
    "policy": "lru",
}


def _doc(tpot: dict[str, float], fit: dict[str, Any]) -> dict[str, Any]:
    rows = [{"set": {"hardware": hw, "cache.experts_per_layer": k}, "tpot_ms": ms, "role": "fit"}
            for (hw, k), ms in zip([("t4", 2), ("t4", 6), ("rtx-4090", 2), ("rtx-4090", 6)], tpot.values(), strict=True)]
    return {"name": "phys", "source": "made up", "base": copy.deepcopy(BASE), "fit": fit, "rows": rows}


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_fit_bounds_lowered_to_physics(tmp_path: Path) -> None:
    fit = {"hardware.pcie_gbps": {"min": 1, "max": 64, "per": "hardware"},
           "runtime.layer_us": {"min": 10, "max": 1e6}}
    ms = load_measurements(_write(tmp_path, _doc({"a": 40, "b": 30, "c": 20, "d": 12}, fit)))
    by = {f.label: f for f in ms.free}
    assert by["hardware.pcie_gbps[hardware=t4]"].hi == 15.75           # PCIe 3.0 x16
    assert by["hardware.pcie_gbps[hardware=rtx-4090]"].hi == 31.5      # PCIe 4.0 x16
    assert "PCIe 3.0 x16 of t4" in by["hardware.pcie_gbps[hardware=t4]"].hi_source
    # a per-layer cost below the shortest measured step (12 ms) over the 4 layers
    assert by["runtime.layer_us"].hi == 3000.0
    assert "rows[3]" in by["runtime.layer_us"].hi_source
    # a test row's step never bounds the fit
    doc = _doc({"a": 40, "b": 30, "c": 20, "d": 12}, fit)
    doc["rows"].append({"set": {"hardware": "t4"}, "tpot_ms": 1.0, "role": "test"})
    assert physical_bound("runtime.layer_us", load_measurements(_write(tmp_path, doc)).rows)[0] == 3000.0
    # the hand-off to CPU experts is paid once per layer too: the same bound
    assert physical_bound("runtime.cpu_switch_us", load_measurements(_write(tmp_path, doc)).rows)[0] == 3000.0


def test_declared_range_beyond_physics_is_refused(tmp_path: Path) -> None:
    fit = {"hardware.pcie_gbps": {"min": 20, "max": 64, "per": "hardware"}}
    with pytest.raises(FitError, match=r"pcie_gbps\[hardware=t4\]'s range \[20, 64\] lies beyond physics: at most 15.75"):
        load_measurements(_write(tmp_path, _doc({"a": 40, "b": 30, "c": 20, "d": 12}, fit)))


def test_value_at_bound_names_missing_cost(tmp_path: Path) -> None:
    # steps far shorter than any copy allows: the link runs to its physical maximum
    fit = {"hardware.pcie_gbps": {"min": 1, "max": 64}}
    doc = _doc({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, fit)
    for r in doc["rows"]:
        r["set"]["hardware"] = "t4"
    ms = load_measurements(_write(tmp_path, doc))
    res = fit_measurements(ms, grid=2, max_evals=3, loo="none")
    doc_out = fitted_document(res, ["simctl", "fit"])
    p = doc_out["parameters"][0]
    assert p["at_bound"] == "max" and p["max"] == 15.75 and p["value"] == pytest.approx(15.75, rel=1e-3)
    assert p["missing_cost"] == missing_cost("hardware.pcie_gbps", "max")
    assert "PCIe 3.0 x16" in p["bound_source"]
    assert doc_out["fit"]["at_bound"] == ["hardware.pcie_gbps at max"]
    assert "AT A BOUND" in p["source"]


def test_attention_rates_are_bounded_by_the_hardware() -> None:
    class _Row:
        role = "fit"
        reference = None
        where = "rows[0]"
        measured = {"tokens_per_s": 50.0}
        data = {"hardware": "dgx-spark-gb10"}

    bound = physical_bound("hardware.kv_read_gbps", [_Row()])
    assert bound is not None and bound[0] == 273 and "dgx-spark-gb10" in bound[1] and "hbm_gbps" in bound[1]
    compute = physical_bound("hardware.attention_tflops", [_Row()])
    assert compute is not None and compute[0] == 125 and "peak_tflops" in compute[1]
    assert "quantized KV cache" in missing_cost("hardware.kv_read_gbps", "max")
