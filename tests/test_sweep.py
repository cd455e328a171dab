"""`simctl sweep`: expansion, validation, the tidy table, failing points, resume after SIGKILL,
the example sweep files, and Dask (a real LocalCluster on loopback) against the local pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.study.sweep import Sweep, SweepError, load_sweep
from moesim.sim.study.sweep_run import run_sweep
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
SWEEPS = sorted((ROOT / "scenarios" / "sweeps").glob("*.yaml"))


def write_sweep(tmp_path: Path, **spec: Any) -> Path:
    """A sweep file over the quickstart scenario with one request (fast points)."""
    data: dict[str, Any] = {"name": "t", "base": str(QUICKSTART), "set": {"workload.requests": 1}}
    data.update(spec)
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# --- expansion ------------------------------------------------------------------------------------
def test_grid_is_the_product_in_file_order(tmp_path: Path) -> None:
    sw = load_sweep(write_sweep(tmp_path, grid={"policy": ["lru", "lfu"], "cache.rate": [0.25, 0.5, 0.75]}))
    assert [(p.params["policy"], p.params["cache.rate"]) for p in sw.points] == [
        ("lru", 0.25), ("lru", 0.5), ("lru", 0.75), ("lfu", 0.25), ("lfu", 0.5), ("lfu", 0.75)]
    assert [p.index for p in sw.points] == list(range(6))
    assert len({p.config_hash for p in sw.points}) == 6
    assert sw.points[0].data["workload"]["requests"] == 1 and sw.points[4].data["cache"]["rate"] == 0.5


def test_zip_varies_keys_together_and_crosses_the_grid(tmp_path: Path) -> None:
    sw = load_sweep(write_sweep(tmp_path, grid={"seed": [0, 1]},
                                zip={"hardware.pcie_gbps": [16, 32], "cache.rate": [0.25, 0.5]}))
    got = [(p.params["seed"], p.params["hardware.pcie_gbps"], p.params["cache.rate"]) for p in sw.points]
    assert got == [(0, 16, 0.25), (0, 32, 0.5), (1, 16, 0.25), (1, 32, 0.5)]
    assert sw.points[1].data["hardware"] == {"base": "rtx-4090", "pcie_gbps": 32}
    assert sw.param_keys == ["seed", "hardware.pcie_gbps", "cache.rate"]


def test_policy_all_takes_the_registry_and_labels_bounds(tmp_path: Path) -> None:
    from moesim.policies.contract.registry import policy_class, policy_names

    sw = load_sweep(write_sweep(tmp_path, grid={"policy": "all"}))
    assert [p.policy for p in sw.points] == policy_names()
    assert [p.bound for p in sw.points] == [bool(policy_class(n).oracle) for n in policy_names()]


def test_policy_params_and_set_overrides(tmp_path: Path) -> None:
    sw = load_sweep(write_sweep(tmp_path, grid={"policy.params.rho": [0.25, 1.0]},
                                set={"workload.requests": 1, "policy": "lcp"}), ["cache.rate=0.5"])
    assert [p.data["policy"] for p in sw.points] == [{"name": "lcp", "params": {"rho": 0.25}},
                                                     {"name": "lcp", "params": {"rho": 1.0}}]
    assert all(p.data["cache"] == {"rate": 0.5, "initial": "empty"} for p in sw.points)


@pytest.mark.parametrize(("spec", "needle"), [
    ({"grid": {"cache.rat": [0.5]}}, "grid: cache.rat: unknown scenario key; did you mean 'cache.rate'?"),
    ({"grid": {"hardware.pcie_gbs": [8]}}, "hardware.pcie_gbs: unknown scenario key; did you mean 'hardware.pcie_gbps'?"),
    ({"gird": {"seed": [1]}}, "gird: unknown key; did you mean 'grid'?"),
    ({"grid": {"policy": ["lru", "lruu"]}}, "unknown policy 'lruu'; did you mean 'lru'?"),
    ({"grid": {"policy": ["lcp"], "policy.params.rh": [1]}}, "policy 'lcp' has no parameter 'rh'; did you mean 'rho'?"),
    ({"grid": {"cache.rate": [0.5, 2.0]}}, "point 1 (cache.rate=2.0): cache.rate: Input should be less than or equal to 1"),
    ({"zip": {"seed": [0, 1], "cache.rate": [0.5]}}, "zip group 1: lists of different lengths (seed has 2, cache.rate has 1)"),
    ({"grid": {"seed": [0, 0]}}, "points 0 and 1 are the same scenario"),
    ({"grid": {"seed": []}}, "grid: seed: empty list"),
    ({"grid": {"seed": [1]}, "zip": {"seed": [2]}}, "seed: swept twice"),
    ({"set": {"workload.request": 1}}, "set: workload.request: unknown scenario key; did you mean 'workload.requests'?"),
])
def test_bad_sweeps_are_one_line_naming_the_key(tmp_path: Path, spec: dict[str, Any], needle: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, **spec)
    with pytest.raises(SweepError) as exc:
        load_sweep(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value) and str(path) in str(exc.value)
    code, out, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith("simctl: error: ") and err.count("\n") == 1 and needle in err
    assert not (tmp_path / "o").exists()


def test_missing_sweep_file_and_bad_dask_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["sweep", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml: no such sweep file" in err
    path = write_sweep(tmp_path, grid={"seed": [0]})
    code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "--dask", "local:zero"], capsys)
    assert code == 2 and "--dask local:zero: expected local:N" in err


# --- running --------------------------------------------------------------------------------------
def test_table_is_tidy_and_failing_points_are_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vram_gib 0.2 cannot hold the non-expert weights: those points fail when they run
    path = write_sweep(tmp_path, grid={"policy": ["lru", "belady"], "hardware.vram_gib": [24, 0.2]})
    code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1", "--no-progress"], capsys)
    assert code == 0, err
    assert "4 points: 4 run, 0 already done; 2 ok, 2 failed" in err
    table = pq.read_table(tmp_path / "o" / "results.parquet")
    assert json.loads(table.schema.metadata[b"moesim.params"]) == ["policy", "hardware.vram_gib"]
    df = table.to_pandas()
    cols = list(df.columns)
    assert cols[:4] == ["point", "hardware.vram_gib", "policy", "bound"]
    assert cols[-5:] == ["status", "error", "wall_s", "moesim_version", "config_hash"]
    assert {"tpot_ms_mean", "tpot_ms_p99", "ttft_ms_mean", "tokens_per_s", "hit_rate", "h2d_gb_per_token"} <= set(cols)
    assert list(df["point"]) == [0, 1, 2, 3] and list(df["policy"]) == ["lru", "lru", "belady", "belady"]
    assert list(df["bound"]) == [False, False, True, True]
    assert list(df["status"]) == ["ok", "error", "ok", "error"]
    assert df["error"][1].endswith("exceed the 0.2 GiB of rtx-4090; lower the budget or override hardware.vram_gib")
    assert df["tpot_ms_mean"][1] != df["tpot_ms_mean"][1]  # NaN for a failed point
    assert df["tpot_ms_mean"][0] > 0 and df["moesim_version"][0]
    assert pd.api.types.is_float_dtype(df["hit_rate"]) and pd.api.types.is_float_dtype(df["hardware.vram_gib"])
    sw = load_sweep(path)
    assert list(df["config_hash"]) == [p.config_hash for p in sw.points]
    # a second run skips everything, failed points included, unless asked to retry them
    code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1"], capsys)
    assert code == 0 and "4 points: 0 run, 4 already done" in err
    code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1", "--retry-failed"], capsys)
    assert code == 0 and "4 points: 2 run, 2 already done" in err
    code, out, _ = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "--dry-run"], capsys)
    assert code == 0 and "4 points, 4 done" in out and "error" in out


def test_a_policy_that_needs_a_missing_column_is_not_applicable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the FLAME sample has no lookahead_logits, which moe-apex-style cannot work without
    path = write_sweep(tmp_path, grid={"policy": ["lru", "moe-apex-style"]})
    code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1", "--no-progress"], capsys)
    assert code == 0, err
    assert "2 points: 1 run, 0 already done; 1 ok, 0 failed, 1 n/a" in err   # the n/a point is not run
    assert "n/a moe-apex-style: needs trace column lookahead_logits, which the trace (flame-moe-290m) lacks" in err
    assert "not run: the policy cannot run as its paper meant it here" in " ".join(err.split())
    df = pq.read_table(tmp_path / "o" / "results.parquet").to_pandas()
    assert list(df["status"]) == ["ok", "n/a"] and list(df["kind"]) == ["lossless", "lossless"]
    assert "needs trace column lookahead_logits" in df["error"][1]


def _done(out: Path) -> list[Path]:
    return sorted((out / "points").glob("*.json")) if (out / "points").is_dir() else []


def test_resume_after_sigkill_skips_finished_points_and_loses_none(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # 16 points of 8 requests: the sweep cannot finish in the moment between the second point's
    # file and the kill (with 8 points of one request it sometimes did, on a quiet machine)
    path = write_sweep(tmp_path, grid={"policy": ["lru", "lfu", "fifo", "no-cache"], "cache.rate": [0.2, 0.3, 0.4, 0.5]},
                       set={"workload.requests": 8})
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "moesim.sim.cli.main", "sweep", str(path), "--out", str(out), "-j", "1",
                             "--no-progress"], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(_done(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    first = {p.name: p.read_bytes() for p in _done(out)}
    assert 2 <= len(first) < 16, "the sweep finished before it could be killed"
    assert not (out / "results.parquet").exists()
    for blob in first.values():
        assert json.loads(blob)["status"] == "ok"  # whole files only
    code, _, err = run_cli(["sweep", str(path), "--out", str(out), "-j", "1"], capsys)
    assert code == 0, err
    assert f"16 points: {16 - len(first)} run, {len(first)} already done; 16 ok, 0 failed" in err
    assert {p.name: p.read_bytes() for p in _done(out) if p.name in first} == first  # not run again
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 16 and (df["status"] == "ok").all()
    assert not list((out / "points").glob(".*"))


def _frame(sw: Sweep, out: Path, **kw: Any) -> pd.DataFrame:
    outcome = run_sweep(sw, out, **kw)
    assert not outcome.failed
    return pd.read_parquet(outcome.table).drop(columns=["wall_s"])


@pytest.mark.slow
def test_dask_local_cluster_equals_the_local_pool(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    sw = load_sweep(write_sweep(tmp_path, grid={"policy": ["lru", "belady", "random"], "cache.rate": [0.25, 0.5]}))
    serial = _frame(sw, tmp_path / "serial", jobs=1)
    pool = _frame(sw, tmp_path / "pool", jobs=2)
    dask = _frame(sw, tmp_path / "dask", dask="local:2")
    pd.testing.assert_frame_equal(serial, pool)
    pd.testing.assert_frame_equal(serial, dask)
    assert len(dask) == 6 and (dask["status"] == "ok").all()


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_example_sweeps_run(path: Path, tmp_path: Path) -> None:
    """Every example sweep expands and validates as written; a few of its points run on a
    shortened workload."""
    sw = load_sweep(path)
    assert len(sw.points) >= 4
    small = ["workload.requests=1"]
    if isinstance(yaml.safe_load(path.read_text()).get("base"), str) and "moepic" in path.name:
        # one request profiled, one replayed: 64 tokens, as many as the sweep's re-planning period
        small = ["trace.synthetic.decode_len=60", "trace.synthetic.prompt_len=4", "trace.synthetic.requests=2"]
    shrunk = load_sweep(path, small)
    picked = shrunk.points[:: max(1, len(shrunk.points) // 4)][:4]
    sub = Sweep(spec=shrunk.spec, source=shrunk.source, base_dir=shrunk.base_dir, points=picked)
    outcome = run_sweep(sub, tmp_path / "o", jobs=1)
    # ``policy: all`` includes policies that need a column the trace may lack (moe-apex-style
    # needs lookahead_logits, which the FLAME sample has not): such points are n/a, never failures
    assert outcome.ran + len(outcome.not_applicable) == len(picked) and not outcome.failed, outcome.failed
    assert len(outcome.not_applicable) < len(picked)
