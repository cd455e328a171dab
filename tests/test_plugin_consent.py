"""Plugins run only with the user's word: without ``--allow-plugins`` (or
``MOESIM_ALLOW_PLUGINS=1``) every command that reads scenarios refuses in one line naming the
file, and the file's code never ran (the plugin here writes a file when imported); with it,
``run``, ``sweep`` (in every worker), ``compare`` and ``fit`` use the plugin's policy, and a
run's summary and ``metrics.json`` name the file with its sha256.

The commands run in child processes: a loaded plugin registers its policy for the rest of a
process, which the other tests' registry must not see."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from moesim.sim.config.scenario import ScenarioError, load_scenario
from moesim.sim.run.runner import run_loaded
from tests.bad_input import base_scenario

PLUGIN = """\
from pathlib import Path
from moesim.policies.baselines.caching import LRU
from moesim.policies.contract.registry import register

Path(__file__).with_name("plugin-ran.txt").write_text("the plugin's code ran")


@register
class MarkerLRU(LRU):
    name = "marker-lru"
    summary = "LRU from a plugin file"
"""


def simctl(args: list[str], cwd: Path, allow_env: bool = False) -> subprocess.CompletedProcess[str]:
    """``simctl ARGS`` in a child process, without MOESIM_ALLOW_PLUGINS unless ``allow_env``."""
    env = {k: v for k, v in os.environ.items() if k != "MOESIM_ALLOW_PLUGINS"}
    if allow_env:
        env["MOESIM_ALLOW_PLUGINS"] = "1"
    return subprocess.run([sys.executable, "-m", "moesim.sim.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A folder with the plugin (plugins/marker.py) and a scenario naming it (s.yaml)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "marker.py").write_text(PLUGIN)
    data: dict[str, Any] = base_scenario()
    data.update(plugins=["plugins/marker.py"], policy="marker-lru")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path


def ran(tree: Path) -> bool:
    return (tree / "plugins" / "plugin-ran.txt").exists()


def refused(proc: subprocess.CompletedProcess[str]) -> None:
    """One line naming the plugin file and how to allow it; exit 2; no traceback."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "marker.py" in lines[0] and "--allow-plugins" in lines[0] and "MOESIM_ALLOW_PLUGINS=1" in lines[0]


def sweep_file(tree: Path) -> Path:
    spec = {"name": "plug", "base": "s.yaml", "grid": {"cache.experts_per_layer": [1, 2, 3]}}
    (tree / "sw.yaml").write_text(yaml.safe_dump(spec))
    return tree / "sw.yaml"


def fit_file(tree: Path) -> Path:
    rows = [{"set": {"cache.experts_per_layer": n}, "tpot_ms": 5.0 * n, "role": role, "source": "made up"}
            for n, role in ((1, "fit"), (2, "fit"), (3, "test"))]
    base = {**yaml.safe_load((tree / "s.yaml").read_text()), "runtime": "hf-eager"}
    doc = {"name": "plug-fit", "source": "made up", "base": base,
           "fit": {"runtime.layer_us": {"min": 10, "max": 1000}}, "rows": rows}
    (tree / "m.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tree / "m.yaml"


@pytest.mark.parametrize("command", ["run", "sweep", "compare", "fit"])
def test_without_consent_no_plugin_code_runs(tree: Path, command: str) -> None:
    args = {"run": ["run", "s.yaml"],
            "sweep": ["sweep", str(sweep_file(tree)), "--jobs", "2", "--out", "o"],
            "compare": ["compare", "s.yaml", "-p", "marker-lru,lru", "--rates", "0.5", "--out", "o"],
            "fit": ["fit", str(fit_file(tree)), "--out", "o", "--grid", "2", "--max-evals", "1", "--loo", "none"],
            }[command]
    refused(simctl(args, tree))
    assert not ran(tree), "the plugin's code ran without the user's word"
    assert not (tree / "o").exists()


def test_run_names_each_plugin_with_its_sha256(tree: Path) -> None:
    digest = hashlib.sha256((tree / "plugins" / "marker.py").read_bytes()).hexdigest()
    proc = simctl(["run", "s.yaml", "--allow-plugins", "--out", "o", "--no-baselines"], tree)
    assert proc.returncode == 0, proc.stderr
    assert ran(tree)
    plugin = str((tree / "plugins" / "marker.py").resolve())
    assert f"{plugin} (sha256 {digest})" in " ".join(proc.stdout.split())
    metrics = json.loads((tree / "o" / "metrics.json").read_text())
    assert metrics["policy"] == "marker-lru"
    assert metrics["plugins"] == [{"file": plugin, "sha256": digest}]


def test_the_environment_variable_allows_plugins(tree: Path) -> None:
    proc = simctl(["run", "s.yaml", "--json", "--no-baselines"], tree, allow_env=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["policy"] == "marker-lru" and ran(tree)


def test_sweep_workers_load_allowed_plugins(tree: Path) -> None:
    proc = simctl(["sweep", str(sweep_file(tree)), "--jobs", "2", "--out", "o", "--allow-plugins",
                   "--no-progress"], tree)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(p.read_text()) for p in (tree / "o" / "points").glob("*.json")]
    assert len(records) == 3 and {r["status"] for r in records} == {"ok"}, records
    assert {r["metrics"]["policy"] for r in records} == {"marker-lru"}


def test_compare_takes_a_plugin_policy(tree: Path) -> None:
    proc = simctl(["compare", "s.yaml", "-p", "marker-lru,lru", "--rates", "0.5", "--out", "o", "--jobs", "2",
                   "--no-figure", "--no-progress", "--allow-plugins"], tree)
    assert proc.returncode == 0, proc.stderr
    assert "| marker-lru |" in proc.stdout and "| lru |" in proc.stdout


def test_fit_takes_a_plugin_policy(tree: Path) -> None:
    proc = simctl(["fit", str(fit_file(tree)), "--out", "o", "--grid", "2", "--max-evals", "1", "--loo", "none",
                   "--allow-plugins"], tree)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "o" / "fitted.yaml").is_file() and ran(tree)


def test_the_library_refuses_too(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook's ``run_loaded`` is held to the same rule as the command line."""
    monkeypatch.delenv("MOESIM_ALLOW_PLUGINS", raising=False)
    with pytest.raises(ScenarioError, match="--allow-plugins"):
        run_loaded(load_scenario(tree / "s.yaml"))
    assert not ran(tree)
