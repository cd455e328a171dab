"""Timeline tracks are named for the device that ran: a run on the CPU (``hardware.device: cpu``)
has no "GPU" or "PCIe" track (issue 35), a GPU run keeps them."""

from __future__ import annotations

import json
from pathlib import Path

from moesim.sim.cli.main import main
from moesim.sim.run.outputs import track_name

ROOT = Path(__file__).resolve().parents[1]
CPU_PROFILE = """hardware:
  name: calibrated-cpu
  device: cpu
  vram_gib: 15.6
  pcie_gbps: 5.1
  peak_tflops: 0.3
  hbm_gbps: 9
  source: "calibration: measured on a test host"
"""


def _tracks(out: Path) -> set[str]:
    tl = json.loads((out / "timeline.json").read_text())
    return {e["args"]["name"] for e in tl["traceEvents"] if e.get("name") == "thread_name"}


def test_track_names() -> None:
    assert [track_name(t, "cpu") for t in ("GPU", "PCIe H2D 0", "PCIe H2D 1", "PCIe D2H", "CPU experts")] \
        == ["CPU compute", "memcpy 0", "memcpy 1", "memcpy back", "CPU experts"]
    assert track_name("PCIe H2D 0", "gpu") == "PCIe H2D 0" and track_name("GPUx", "cpu") == "GPUx"


def test_a_cpu_run_has_no_gpu_or_pcie_track(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(CPU_PROFILE)
    scen = str(ROOT / "scenarios/validate-cpu.yaml")
    assert main(["run", scen, "--set", f"hardware={tmp_path / 'p.yaml'}", "--no-baselines", "--timeline",
                 "--out", str(tmp_path / "cpu")]) == 0
    cpu = _tracks(tmp_path / "cpu")
    assert "CPU compute" in cpu and any(t.startswith("memcpy") for t in cpu), cpu
    assert not any(t.startswith(("GPU", "PCIe")) for t in cpu), cpu
    assert main(["run", scen, "--no-baselines", "--timeline", "--out", str(tmp_path / "gpu")]) == 0
    gpu = _tracks(tmp_path / "gpu")
    assert "GPU" in gpu and any(t.startswith("PCIe H2D") for t in gpu), gpu
