"""``simctl validate``: the simulator (calibrated) against the executor on one scenario prints
predicted and measured per metric with the error; hit rates of a demand policy are identical;
a missing or malformed profile is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moesim.sim.cli.main import main

MODEL = {"name": "tiny", "num_layers": 2, "num_experts": 4, "top_k": 2, "hidden_size": 32,
         "expert_intermediate_size": 64, "dtype_bytes": 4}


def _scenario(tmp_path: Path, **extra: object) -> Path:
    scen = tmp_path / "v.yaml"
    scen.write_text(yaml.safe_dump({
        "name": "tiny-validate",
        "trace": {"synthetic": {"num_layers": 2, "num_experts": 4, "top_k": 2, "requests": 2,
                                "prompt_len": 3, "decode_len": 6}},
        "model": MODEL, "hardware": "rtx-4090", "cache": {"rate": 0.5}, "policy": "lfu", **extra}))
    return scen


def test_validate_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    assert main(["validate", str(_scenario(tmp_path)), "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("TPOT p50 (ms)", "TTFT mean (ms)", "hit rate", "H2D GB", "identical"):
        assert label in text
    data = json.loads((out / "validation.json").read_text())
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["hit_rate"]["predicted"] == rows["hit_rate"]["measured"]
    assert rows["h2d_gb"]["predicted"] == pytest.approx(rows["h2d_gb"]["measured"])
    assert rows["tpot_ms.p50"]["measured"] > 0 and rows["tpot_ms.p50"]["error_pct"] is not None
    assert (out / "profile.yaml").is_file()


@pytest.mark.parametrize("content, needle", [(None, "no such hardware profile file"), ("a: [\n", "line")])
def test_validate_bad_profile_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          content: str | None, needle: str) -> None:
    pytest.importorskip("torch")  # without the tracer extra validate stops before (test_first_hour)
    prof = tmp_path / "p.yaml"
    if content is not None:
        prof.write_text(content)
    assert main(["validate", str(_scenario(tmp_path)), "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_validate_refuses_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    scen = _scenario(tmp_path, workload={"batch_size": 2})
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"hardware": {"vram_gib": 1, "pcie_gbps": 1, "peak_tflops": 1, "hbm_gbps": 1}}))
    assert main(["validate", str(scen), "--profile", str(prof), "--out", str(tmp_path / "o")]) == 2
    assert "batch_size 1" in capsys.readouterr().err
