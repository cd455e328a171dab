"""``simctl calibrate`` on CPU with a tiny model: the profile is valid YAML with provenance and
raw measurements, a scenario accepts it as ``hardware:`` and ``runtime:``, ``simctl hardware``
shows where its numbers come from; bad input is one line and exit 2."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.real.calibration.timing import fit_line

TINY = "{name: tiny, num_layers: 2, num_experts: 4, top_k: 2, hidden_size: 32, expert_intermediate_size: 64, dtype_bytes: 4}"


@cache
def _profile(tmp: str) -> Path:
    out = Path(tmp) / "profile.yaml"
    assert main(["calibrate", "--model", TINY, "--quick", "--context", "8", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return _profile(str(tmp_path_factory.mktemp("cal")))


def test_profile_has_provenance_measurements_and_fits(profile: Path) -> None:
    data = yaml.safe_load(profile.read_text())
    prov = data["provenance"]
    for key in ("device", "torch", "date", "command"):
        assert prov[key]
    assert "calibrate" in prov["command"]
    hw, rt = data["hardware"], data["runtime"]
    c = hw["costs"]
    assert hw["pcie_gbps"] > 0 and c["expert_us"] + c["expert_us_per_token"] > 0
    assert c["layer_us"] + c["layer_us_per_token"] > 0
    # the context slope is the one kept raw in measurements, clamped at 0
    assert c["layer_us_per_context_token"] == pytest.approx(
        max(0.0, data["measurements"]["layer_context_slope_us_per_token"]), abs=1e-6)
    assert hw["sources"]["pcie_gbps"].startswith("calibration")
    m = data["measurements"]
    sizes = [r["bytes"] for r in m["copies"]]
    assert sizes == sorted(sizes) and len(sizes) >= 3
    # the fit is the least-squares line of the raw copy times it came from
    a, b = fit_line([r["bytes"] for r in m["copies"]], [r["h2d_s"] for r in m["copies"]])
    assert hw["pcie_latency_us"] == pytest.approx(a * 1e6, abs=1e-3)
    # a non-positive slope (copy time flat in size: a machine too loaded to measure) is written as
    # the documented 1000 GB/s ceiling rather than a division by zero
    assert hw["pcie_gbps"] == (pytest.approx(1 / b / 1e9, rel=1e-3) if b > 0 else 1e3)
    assert rt["iteration_us"] >= 0 and rt["layer_us"] >= 0 and rt["source"]
    # the demand-load cost comes from the two executor runs, kept raw beside the fit
    runs = m["executor_runs"]
    assert len(runs["raw"]["resident"]) == len(runs["raw"]["demand"]) == runs["repeats"] >= 2
    assert runs["resident_s"] == min(r["tpot_p50_s"] for r in runs["raw"]["resident"])
    fit = m["demand_load_fit"]
    assert rt["demand_load_us"] == pytest.approx(max(0.0, (fit["measured_gap_us"] - fit["predicted_gap_us"])
                                                      / fit["loads_per_step"]), abs=1e-3)
    assert data["model"]["hidden_size"] == 32
    # the host CPU: on a CPU device the device's expert times, with the bandwidth they imply
    cpu = hw["cpu"]
    assert cpu["threads"] == 1 and cpu["expert_us"] == c["expert_us"]
    one = next(r["s"] for r in m["host_experts"] if r["tokens"] == 1)
    assert cpu["mem_gbps"] == pytest.approx(4 * 3 * 32 * 64 / one / 1e9, rel=1e-3)
    assert set(cpu["sources"]) >= {"mem_gbps", "expert_us", "expert_us_by_tokens", "threads"}
    assert cpu["expert_us_by_tokens"] == {r["tokens"]: round(r["s"] * 1e6, 3) for r in m["host_experts"]}
    assert "pageable_gbps" not in hw   # pinned and pageable differ on a GPU only


def test_a_scenario_accepts_the_profile(profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moesim.sim.config.scenario import load_scenario

    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({
        "trace": {"synthetic": {"num_layers": 2, "num_experts": 4, "top_k": 2, "requests": 1, "prompt_len": 2, "decode_len": 4}},
        "model": yaml.safe_load(TINY), "hardware": str(profile), "runtime": str(profile),
        "cache": {"rate": 0.5}, "policy": "lru"}))
    loaded = load_scenario(scen)
    hw = loaded.hardware_spec()
    assert hw.costs is not None and hw.source.startswith("calibration")
    assert loaded.runtime_spec().name == "calibrated-cpu"
    assert main(["run", str(scen), "--json"]) == 0
    assert '"hit_rate"' in capsys.readouterr().out
    assert main(["hardware", str(profile)]) == 0
    shown = capsys.readouterr().out
    assert "calibration: measured" in shown and "demand_load_us" in shown


def test_hardware_catalog_states_its_sources(capsys: pytest.CaptureFixture[str]) -> None:
    from moesim.sim.config.catalog import get_hardware, hardware_names

    for name in hardware_names():
        h = get_hardware(name)
        for field in ("vram_gib", "pcie_gbps", "peak_tflops", "hbm_gbps"):
            assert h.source_of(field).split(":")[0] in ("spec sheet", "derivation", "assumption", "measurement", "fit")
    assert main(["hardware", "rtx-4090"]) == 0
    assert "PCIe 4.0" in capsys.readouterr().out


@pytest.mark.parametrize("content, needle", [
    (None, "no such hardware profile file"),
    ("hardware: [1, 2\n", "profile.yaml"),
    ("- a list\n", "must be a mapping"),
])
def test_bad_profile_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, needle: str) -> None:
    prof = tmp_path / "profile.yaml"
    if content is not None:
        prof.write_text(content)
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({
        "trace": {"synthetic": {"num_layers": 2, "num_experts": 4, "top_k": 2, "requests": 1, "prompt_len": 2, "decode_len": 4}},
        "model": yaml.safe_load(TINY), "hardware": "profile.yaml", "cache": {"rate": 0.5}, "policy": "lru"}))
    assert main(["run", str(scen)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "hardware" in err


def test_calibrate_bad_output_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")  # without the tracer extra calibrate stops before (test_first_hour)
    assert main(["calibrate", "--model", TINY, "--out", "profile.txt"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ".yaml" in err
