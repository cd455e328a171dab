"""An interrupted study leaves no process behind and says how to resume: ``simctl sweep --jobs 2``
(and ``compare``, which runs on the same pool) killed with SIGTERM, SIGKILL or a terminal's
Ctrl-C (SIGINT to the whole process group) while its workers run. Every process the study
started (fork server, resource tracker, workers) carries a tag in its environment, which
survives their being re-parented to init; a /proc scan finds them."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.util import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")


def tagged(tag: str) -> set[int]:
    """The pids of the processes whose environment holds ``MOESIM_TEST_TAG=tag``."""
    want = f"MOESIM_TEST_TAG={tag}".encode()
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if want in env and state != "Z":
                found.add(int(d.name))
    return found


@pytest.fixture
def tag() -> Iterator[str]:
    """A fresh tag; whatever still carries it after the test is killed (so that a failing test
    leaves nothing running either)."""
    value = uuid.uuid4().hex
    yield value
    for pid in tagged(value):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def start(tmp_path: Path, args: list[str], tag: str) -> subprocess.Popen[str]:
    """``simctl ARGS`` in a new session (its own process group, as a terminal's job), tagged."""
    env = {**os.environ, "MOESIM_TEST_TAG": tag}
    proc = subprocess.Popen([sys.executable, "-m", "moesim.sim.cli.main", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc


def wait_for_points(out: Path, proc: subprocess.Popen[str], tag: str) -> None:
    """Until a point is done and the workers run (so the kill lands mid-study)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the study ended before it was killed: {proc.communicate()}")
        if any((out / "points").glob("*.json")) and len(tagged(tag)) >= 4:   # simctl, fork server, 2 workers
            return
        time.sleep(0.01)
    pytest.fail("no point finished in 90 s")


def assert_none_left(tag: str) -> None:
    deadline = time.monotonic() + 10
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tagged(tag), f"processes left behind: {tagged(tag)}"


def sweep_file(tmp_path: Path) -> Path:
    spec = {"name": "sig", "base": str(ROOT / "scenarios" / "quickstart.yaml"), "set": {"workload.requests": 8},
            "grid": {"cache.rate": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], "seed": [1, 2, 3, 4, 5, 6]}}
    (tmp_path / "sw.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "sw.yaml"


@pytest.mark.parametrize(("how", "code"), [("SIGTERM", 143), ("SIGKILL", -9), ("Ctrl-C", 130)])
def test_a_killed_sweep_leaves_no_process(tmp_path: Path, tag: str, how: str, code: int) -> None:
    proc = start(tmp_path, ["sweep", str(sweep_file(tmp_path)), "--jobs", "2", "--out", "o", "--no-progress",
                                 "--force"], tag)
    wait_for_points(tmp_path / "o", proc, tag)
    if how == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)   # what a terminal sends: every process of the job
    else:
        os.kill(proc.pid, signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert_none_left(tag)
    if how == "SIGKILL":
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"simctl: interrupted ({how}) with ")
    resume = lines[0].split("resume with: ", 1)[1]
    assert shlex.split(resume) == ["simctl", "sweep", str(tmp_path / "sw.yaml"), "--jobs", "2", "--no-progress",
                                   "--out", "o"]
    if how == "SIGTERM":   # the command resumes: the kept points count as done (--dry-run lists them)
        done = len(list((tmp_path / "o" / "points").glob("*.json")))
        assert f"with {done} of 48 points done and kept in o;" in lines[0]
        again = subprocess.run([sys.executable, "-m", "moesim.sim.cli.main", *shlex.split(resume)[1:], "--dry-run"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[-1] == f"48 points, {done} done, output o"


def test_a_killed_compare_leaves_no_process(tmp_path: Path, tag: str) -> None:
    scen = ROOT / "scenarios" / "quickstart.yaml"
    proc = start(tmp_path, ["compare", str(scen), "-p", "lru,lfu,fifo,random", "--rates",
                                 "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8", "--set", "workload.requests=8", "--jobs", "2",
                                 "--out", "o", "--no-figure", "--no-progress"], tag)
    wait_for_points(tmp_path / "o", proc, tag)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "simctl: interrupted (SIGTERM)" in err and f"resume with: simctl compare {scen}" in err
    assert_none_left(tag)
