"""`simctl run`, `schema`, `policies`, `models`, `hardware`: outputs and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.traces.format.trace_file import read_trace
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def small_scenario(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["trace"] = str(ROOT / "traces" / "samples" / "flame-moe-290m.parquet")
    data["workload"]["requests"] = 2
    data.update(changes)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_run_writes_the_four_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = small_scenario(tmp_path)
    code, out, err = run_cli(["run", str(scen), "--out", str(tmp_path / "o"), "--timeline"], capsys)
    assert code == 0, err
    assert "TPOT ms" in out and "hit" in out
    files = {p.name for p in (tmp_path / "o").iterdir()}
    assert files == {".moesim-output", "config.yaml", "metrics.json", "steps.parquet", "timeline.json"}
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["output_tokens"] == 128 and metrics["policy"] == "lru"
    config = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())
    assert config["resolved"]["config_hash"] == metrics["config_hash"]
    assert config["resolved"]["budget_experts_per_layer"] == pytest.approx(16)
    steps = pq.read_table(tmp_path / "o" / "steps.parquet")
    assert steps.num_rows == 128 * 8
    assert int(sum(steps.column("misses").to_pylist())) == metrics["misses"]
    tl = json.loads((tmp_path / "o" / "timeline.json").read_text())
    tracks = {e["args"]["name"] for e in tl["traceEvents"] if e.get("name") == "thread_name"}
    assert {"GPU", "PCIe H2D 0"} <= tracks
    spans = [e for e in tl["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in spans) and len(spans) > 1000


def test_set_overrides_any_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = small_scenario(tmp_path)
    code, out, _ = run_cli(["run", str(scen), "--json", "--set", "cache.experts_per_layer=64",
                            "--set", "hardware.pcie_gbps=16", "--set", "policy=belady"], capsys)
    assert code == 0
    m = json.loads(out)
    assert m["policy"] == "belady" and m["bound"] is True
    # the whole layer fits: only the first use of each (layer, expert) misses
    tr = read_trace(ROOT / "traces" / "samples" / "flame-moe-290m.parquet")
    sel = tr.request_id < 2
    pairs = {(int(layer), int(e)) for layer, row in zip(tr.layer[sel], tr.experts[sel], strict=True) for e in row}
    assert m["misses"] == len(pairs) and m["evictions"] == 0


def test_set_reaches_into_a_runtime_named_by_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--set runtime.layer_us=...`` on a scenario whose runtime is a catalog name changes that
    entry (as ``model.*`` and ``hardware.*`` do), instead of failing on a string."""
    scen = small_scenario(tmp_path)
    base = ["run", str(scen), "--json", "--set", "runtime=hf-eager"]
    code, out, _ = run_cli(base, capsys)
    assert code == 0
    before = json.loads(out)["runtime_overhead_ms"]
    code, out, _ = run_cli([*base, "--set", "runtime.layer_us=700"], capsys)
    assert code == 0
    after = json.loads(out)["runtime_overhead_ms"]
    assert after > before   # hf-eager's layer_us is 350: twice the per-layer overhead


def test_same_scenario_same_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = small_scenario(tmp_path, policy="random")
    for out in ("a", "b"):
        assert run_cli(["run", str(scen), "--out", str(tmp_path / out), "--timeline"], capsys)[0] == 0
    for name in ("metrics.json", "config.yaml", "timeline.json", "steps.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize(
    "changes, overrides, fragment",
    [
        ({"cache": {"rate": 1.5}}, [], "cache.rate: Input should be less than or equal to 1"),
        ({"cache": {"rate": 0.5, "gib": 1}}, [], "exactly one of rate, experts_per_layer, gib"),
        ({"bogus": 1}, [], "bogus: unknown key"),
        ({"policy": "lur"}, [], "unknown policy 'lur'; did you mean 'lru'?"),
        ({"policy": {"name": "lru", "params": {"size": 3}}}, [], "policy 'lru' has no parameter 'size'"),
        ({"hardware": "rtx-4900"}, [], "unknown hardware 'rtx-4900'; did you mean 'rtx-4090'?"),
        ({"model": "mixtral-8x7b"}, [], "but the trace (flame-moe-290m) has 8 x 64"),
        ({"trace": "missing.parquet"}, [], "missing.parquet: no such file"),
        ({}, ["hardware.pcie_gbps=-3"], "hardware.pcie_gbps: Input should be greater than 0"),
        ({}, ["workload.batch_size=0"], "workload.batch_size: Input should be greater than 0"),
        ({}, ["cache.rate=1", "hardware.vram_gib=1"], "exceed the 1 GiB of rtx-4090"),
        ({}, ["nokey"], "expected KEY=VALUE"),
    ],
)
def test_bad_scenarios_fail_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          changes: dict, overrides: list[str], fragment: str) -> None:  # type: ignore[type-arg]
    scen = small_scenario(tmp_path, **changes)
    args = ["run", str(scen), "--out", str(tmp_path / "o")]
    for o in overrides:
        args += ["--set", o]
    code, out, err = run_cli(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simctl: error: "), err
    assert fragment in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("ref", ["gone.parquet", "sub/gone-fit.yaml"])
def test_a_missing_relative_trace_names_the_folder_it_was_resolved_against(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: str) -> None:
    """``--set trace=REL`` resolves against the scenario's folder, not the working directory;
    the one line says so and names both (issue 35)."""
    scen = small_scenario(tmp_path)
    code, _, err = run_cli(["run", str(scen), "--set", f"trace={ref}", "--out", str(tmp_path / "o")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert (f"trace: {ref}: no such file (a relative trace path, in the scenario or in --set trace=, is resolved "
            f"against the scenario's folder {scen.parent}: {scen.parent / ref}; give an absolute path") in lines[0]
    code, _, err = run_cli(["run", str(scen), "--set", f"trace={tmp_path / ref}"], capsys)
    assert code == 2 and err.strip().endswith(f"trace: {tmp_path / ref}: no such file")


def test_missing_and_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["run", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml: no such scenario file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    code, _, err = run_cli(["run", str(bad)], capsys)
    assert code == 2 and "bad.yaml: line" in err and len(err.strip().splitlines()) == 1
    notrace = tmp_path / "t.parquet"
    notrace.write_bytes(b"not parquet")
    scen = small_scenario(tmp_path, trace=str(notrace))
    code, _, err = run_cli(["run", str(scen)], capsys)
    assert code == 2 and "t.parquet" in err and "not a Parquet file" in err


def test_listing_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["policies"], capsys)
    assert code == 0 and "mixtral-offloading" in out and "oracle bound" in out
    code, out, _ = run_cli(["models"], capsys)
    assert code == 0 and "qwen3-30b-a3b" in out and "deepseek-v3" in out
    code, out, _ = run_cli(["hardware"], capsys)
    assert code == 0 and "rtx-a6000" in out
    code, out, _ = run_cli(["schema"], capsys)
    schema = json.loads(out)
    assert code == 0 and {"trace", "hardware", "cache", "policy"} <= set(schema["properties"])


# scenarios/sweeps/ holds sweep files, not scenarios: tests/test_sweep.py runs them
@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if "sweeps" not in p.parts),
                         ids=lambda p: p.name)
def test_every_example_scenario_runs_as_is(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shipped scenario runs; one with plugins runs with --allow-plugins, and its metrics name
    each plugin file with its sha256."""
    monkeypatch.delenv("MOESIM_ALLOW_PLUGINS", raising=False)   # --allow-plugins sets it: undone after
    plugins = (yaml.safe_load(path.read_text()) or {}).get("plugins") or []
    code, out, err = run_cli(["run", str(path), "--json", *(["--allow-plugins"] if plugins else [])], capsys)
    assert code == 0, err
    m = json.loads(out)
    assert m["output_tokens"] > 0 and m["sim_time_s"] > 0
    assert [Path(p["file"]) for p in m.get("plugins", [])] == [(path.parent / p).resolve() for p in plugins]


def test_an_internal_error_keeps_its_traceback_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (not bad input) is not dressed up as a user error: traceback, exit 1, 'this is a bug'."""
    from moesim.policies.baselines.caching import LRU

    def broken(self, ctx):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    monkeypatch.setattr(LRU, "setup", broken)
    code, _, err = run_cli(["run", str(small_scenario(tmp_path))], capsys)
    assert code == 1
    assert "Traceback" in err and "KeyError" in err and "this is a bug" in err


def test_a_name_with_an_emoji_code_is_printed_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = small_scenario(tmp_path, name="a:fire:b")
    code, out, _ = run_cli(["run", str(scen), "--no-progress"], capsys)
    assert code == 0
    assert "a:fire:b" in out and "\N{FIRE}" not in out
