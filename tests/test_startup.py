"""The fixed cost of a ``simctl`` process: the command tree loads only what the command run
needs, and the lazily loaded commands behave as registered ones (help, order, suggestions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moesim.sim.cli import main

LAZY_MODULES = ("moesim.traces.cli", "moesim.traces.model_cli", "moesim.traces.quality_cli",
                "moesim.sim.study_cli", "moesim.sim.curve")


def _modules_after(code: str) -> set[str]:
    """The modules loaded by a fresh interpreter after running ``code``."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_cli_loads_no_other_command_module() -> None:
    loaded = _modules_after("import moesim.sim.cli")
    assert not loaded & set(LAZY_MODULES)


def test_run_help_builds_no_other_command() -> None:
    loaded = _modules_after("from moesim.sim.cli import main\nmain(['run', '--help'])")
    assert not loaded & set(LAZY_MODULES)
    assert "pandas" not in loaded and "matplotlib" not in loaded


def test_help_lists_every_command_in_registration_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    names = ["quality", "run", "schema", "policies", "models", "hardware", "calibrate", "validate",
             "sweep", "compare", "plot", "curve", "trace", "model"]
    where = [out.find(f"│ {n} ") for n in names]
    assert all(w >= 0 for w in where), out
    assert where == sorted(where)
    assert "Record, import, synthesise and inspect moe-trace files." in out
    assert "Run a sweep: every point of the grid" in out   # a docstring's first line


@pytest.mark.parametrize(("typo", "name"), [("trac", "trace"), ("swep", "sweep"), ("rn", "run")])
def test_a_mistyped_command_suggests_lazy_and_eager_ones(typo: str, name: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([typo]) == 2
    assert f"Did you mean '{name}'?" in capsys.readouterr().err


def test_lazy_group_and_command_take_their_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--help"]) == 0
    assert "synth" in capsys.readouterr().out
    assert main(["curve", "--bogus"]) == 2
    assert "No such option: --bogus" in capsys.readouterr().err
