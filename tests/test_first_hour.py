"""Issue 15 beyond the bad-input corpus: atomic and re-runnable outputs, no silent fallback
(each one a warning in the summary and metrics.json), and the first-hour commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.core.atomic import TMP_TAG
from moesim.sim.run import outputs
from tests.bad_input import scen


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def scenario(tmp_path: Path, **changes: object) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(scen(**changes))
    return p


def warnings_of(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str, **changes: object) -> list[str]:
    code, out, err = run_cli(["run", str(scenario(tmp_path, **changes)), "--json", *args], capsys)
    assert code == 0, err
    found: list[str] = json.loads(out)["warnings"]
    return found


# --- outputs ----------------------------------------------------------------------------------
def test_config_yaml_reruns_byte_identically(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    code, _, err = run_cli(["run", str(s), "--out", str(tmp_path / "a"), "--set", "cache.rate=0.5"], capsys)
    assert code == 0, err
    monkeypatch.chdir(tmp_path / "elsewhere")     # the copy names its trace by an absolute path
    code, _, err = run_cli(["run", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    for name in ("config.yaml", "metrics.json", "steps.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["cache"] == {
        "rate": 0.5, "initial": "empty", "buffer_experts": 0, "swap_out": False}


def test_force_replaces_and_stale_temporaries_go(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = scenario(tmp_path)
    out = tmp_path / "o"
    code, _, err = run_cli(["run", str(s), "--out", str(out), "--timeline"], capsys)   # an earlier run
    assert code == 0, err
    stale = tmp_path / f".o{TMP_TAG}999999999"     # a killed run's leftover (no such process)
    stale.mkdir()
    code, _, err = run_cli(["run", str(s), "--out", str(out)], capsys)
    assert code == 2 and "--force" in err and (out / "timeline.json").exists()
    code, _, err = run_cli(["run", str(s), "--out", str(out), "--force"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [".moesim-output", "config.yaml", "metrics.json", "steps.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "s.yaml"]


def test_a_failure_mid_write_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> object:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "steps_table", broken)
    code, _, err = run_cli(["run", str(scenario(tmp_path)), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_summary_lists_every_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = scenario(tmp_path, hardware={"base": "rtx-4090", "pcie_gbps": 16})
    code, out, err = run_cli(["run", str(s), "--set", "cache.rate=0.5", "--set", "seed=3"], capsys)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("overrides"))
    assert "--set cache.rate=0.5" in line and "--set seed=3" in line and "hardware.pcie_gbps=16 (on rtx-4090)" in line


# --- no silent fallback -------------------------------------------------------------------------
def test_budget_floored_per_layer_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # FLAME-MoE-290M: 8 layers; 16.5 experts per layer of budget run as 16
    whole = warnings_of(tmp_path, capsys, cache={"experts_per_layer": 16})
    assert not any("whole experts" in w for w in whole)
    part = warnings_of(tmp_path, capsys, cache={"experts_per_layer": 16.5})
    floor = [w for w in part if "whole experts" in w]
    assert floor and "16.50 experts per layer" in floor[0] and "16 per layer are used" in floor[0]


def test_ttft_without_prefill_and_prefetcher_without_logits_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = warnings_of(tmp_path, capsys, policy="mixtral-offloading")
    assert any("no prefill" in w for w in found)
    assert any("no lookahead_logits" in w for w in found)
    code, out, _ = run_cli(["run", str(tmp_path / "s.yaml"), "--set", "policy=mixtral-offloading"], capsys)
    assert code == 0 and "workload.phases: [decode]" in out     # markup-escaped in the summary


def test_moepic_that_cannot_act_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = warnings_of(tmp_path, capsys, policy={"name": "moepic", "params": {"tau": 100000}})
    assert any("configurator (Algorithm 1) never ran" in w and "tau = 100000" in w for w in found)
    assert any("transfer buffer" in w and "never issues" in w for w in found)
    found = warnings_of(tmp_path, capsys, policy={"name": "moepic", "params": {"tau": 50}},
                        cache={"rate": 0.25, "buffer_experts": 6})
    assert not any("never ran" in w or "never issues" in w for w in found)


# --- the first hour -----------------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.startswith("moesim ") and len(out.split()) == 2


def test_policies_fit_80_columns_and_describe_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["policies"], capsys)
    assert code == 0 and "moepic" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, _ = run_cli(["policies", "mixtral-offloading"], capsys)
    assert code == 0
    assert "prefetch_experts" in out and "source:" in out and "trace must contain: experts" in out
    code, out, _ = run_cli(["policies", "moe-infinity"], capsys)
    assert code == 0 and "eamc_capacity" in out


def test_sweep_force_replaces_only_a_moesim_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = scenario(tmp_path)
    sw = tmp_path / "sw.yaml"
    sw.write_text("name: sw\nbase: s.yaml\ngrid:\n  cache.rate: [0.5]\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["sweep", str(sw), "--out", str(out), "-j", "1", "--no-progress"]
    for extra in ([], ["--force"]):   # the user's folder: refused, --force or not, and not offered
        code, _, err = run_cli([*args, *extra], capsys)
        assert code == 2 and "moesim did not write" in err and "--force" not in err
        assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    assert run_cli(["run", str(s), "--out", str(out)], capsys)[0] == 0      # now a run's output
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "--force" in err and (out / "metrics.json").exists()
    code, _, err = run_cli([*args, "--force"], capsys)
    assert code == 0, err
    assert not (out / "metrics.json").exists() and (out / "results.parquet").exists()
    code, _, err = run_cli(args, capsys)            # its own folder: resumed, no --force needed
    assert code == 0 and "1 already done" in err


@pytest.mark.parametrize("argv", [["calibrate", "-o", "{tmp}/p.yaml"],
                                  ["validate", "scenarios/validate-cpu.yaml", "--out", "{tmp}/v"]])
def test_model_commands_without_the_tracer_extra_are_one_line(argv: list[str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch (the README's dev install has none), calibrate and validate say what to
    install in one line and exit 2, instead of an import traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tracer extra" in err and "torch==2.13.0" in err
    assert not any(tmp_path.iterdir())
