"""Studies that respect the user's time: progress lines with the time left off a terminal, n/a
counted apart from failures, a default folder that never overwrites another study, join keys on
every run and sweep row, and the sweep table as CSV."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.study.progress import Counts, format_seconds, line_every, progress
from moesim.sim.study.study_record import default_out, read_study
from moesim.sim.study.sweep import load_sweep
from moesim.sim.study.sweep_run import run_sweep
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
TRACE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
JOIN = ["model_name", "hardware_name", "runtime_name", "runtime_source", "cache_rate", "trace_name", "trace_sha256"]


def sweep_file(tmp: Path, policies: list[str], name: str = "s") -> Path:
    spec = {"name": name, "base": str(QUICKSTART), "set": {"workload.requests": 1},
            "grid": {"policy": policies, "cache.rate": [0.25, 0.5]}}
    path = tmp / f"{name}-{len(policies)}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_counts_say_n_a_apart_from_failures_and_the_time_left() -> None:
    c = Counts(total=10, done=2, n_a=2)      # two n/a points recorded before anything ran
    c.t0 -= 4.0                              # four seconds ago
    c.add({"status": "ok"})
    c.add({"status": "error"})
    assert (c.done, c.n_a, c.failed) == (4, 2, 1)
    assert c.tally() == "2 n/a, 1 failed"
    eta = c.eta()
    assert eta is not None and 11.9 < eta < 12.5      # 2 points in ~4 s, 6 left
    assert c.line("study").startswith("study: 4/10 points, 2 n/a, 1 failed; 4.")
    assert c.line("study").endswith("about 12 s left")
    assert Counts(total=3, done=0, n_a=0).eta() is None
    assert [format_seconds(s) for s in (3.2, 185, 3720)] == ["3 s", "3 min 5 s", "1 h 2 min"]
    assert [line_every(n) for n in (1, 19, 40, 1000)] == [1, 1, 2, 50]


def test_progress_lines_one_per_few_points() -> None:
    out = io.StringIO()
    with progress("lines", "demo", total=40, done=0, n_a=0, stream=out) as tick:
        for i in range(40):
            tick({"status": "n/a" if i < 3 else "ok"})
    lines = out.getvalue().splitlines()
    assert len(lines) == 20             # one line every 2 points
    assert lines[0].startswith("demo: 2/40 points, 2 n/a; ")
    assert lines[-1].startswith("demo: 40/40 points, 3 n/a; ") and "failed" not in lines[-1]


def test_sweep_off_a_terminal_prints_progress_lines_and_counts_n_a_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = sweep_file(tmp_path, ["lru", "moepic"])
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1"]) == 0   # stderr is not a terminal here
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("s: ")]
    assert lines and lines[-1].startswith("s: 4/4 points, 2 n/a; ") and "failed" not in lines[-1]
    assert "4 points: 2 run, 0 already done; 2 ok, 0 failed, 2 n/a" in " ".join(err.split())
    outcome = run_sweep(load_sweep(path), tmp_path / "o", jobs=1)
    assert outcome.summary() == "4 points: 2 ok, 0 failed, 2 n/a"


def test_default_folder_is_reused_only_by_the_same_study(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = load_sweep(sweep_file(tmp_path, ["lru"]))
    other = load_sweep(sweep_file(tmp_path, ["lru", "fifo"]))
    folder, note = default_out(first, runs)
    assert folder == runs / "s" and note is None
    run_sweep(first, folder, jobs=1, command=["simctl", "sweep", "a.yaml"])
    assert default_out(first, runs) == (runs / "s", None)          # the same study: resumed
    moved, note = default_out(other, runs, now=0.0)
    assert moved.parent == runs and re.fullmatch(r"s-\d{8}-\d{6}", moved.name)
    assert note is not None and "holds another study" in note and str(moved) in note
    moved.mkdir()
    again, _ = default_out(other, runs, now=0.0)
    assert again != moved and again.name.startswith(moved.name)     # never the same folder twice
    study = read_study(folder)
    assert study["points"] == [p.config_hash for p in first.points]
    assert [c["command"] for c in study["commands"]] == ["simctl sweep a.yaml"]
    run_sweep(first, folder, jobs=1, command=["simctl", "sweep", "a.yaml", "-j", "1"])
    assert len(read_study(folder)["commands"]) == 2                 # each call appended


def test_every_run_and_sweep_row_carries_the_join_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(QUICKSTART), "--set", "workload.requests=1", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    digest = hashlib.sha256(TRACE.read_bytes()).hexdigest()
    assert {k: metrics[k] for k in JOIN} == {
        "model_name": "flame-moe-290m", "hardware_name": "rtx-4090", "runtime_name": "none",
        "runtime_source": "no overhead (idealised runtime)", "cache_rate": 0.25,
        "trace_name": "flame-moe-290m.parquet", "trace_sha256": digest}
    path = sweep_file(tmp_path, ["lru", "belady"])
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "-j", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["table", str(tmp_path / "o")]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(df) == 4 and set(JOIN) <= set(df.columns)
    assert list(df["cache_rate"]) == list(df["cache.rate"]) and set(df["trace_sha256"]) == {digest}
    assert main(["table", str(tmp_path / "o"), "-c", "policy,cache.rate,tpot_ms_mean", "-o", str(tmp_path / "t.csv")]) == 0
    small = pd.read_csv(tmp_path / "t.csv")
    assert list(small.columns) == ["policy", "cache.rate", "tpot_ms_mean"] and list(small["policy"]) == ["lru", "belady"] * 2
    capsys.readouterr()
    assert main(["table", str(tmp_path / "o"), "-c", "polcy"]) == 2
    assert "did you mean 'policy'" in capsys.readouterr().err
    assert main(["table", str(tmp_path / "o"), "-f", "markdown", "-c", "policy,status"]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == ["| policy | status |", "| --- | ---: |", "| lru | ok |"]
