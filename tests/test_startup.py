"""The fixed cost of a ``simctl`` process: the command tree loads only what the command run
needs, and the lazily loaded commands behave as registered ones (help, order, suggestions)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moesim.sim.cli.main import main
from moesim.sim.run.metrics import percentile

LAZY_MODULES = ("moesim.traces.cli", "moesim.traces.tiny.model_cli", "moesim.sim.cli.quality",
                "moesim.sim.cli.study", "moesim.sim.study.curve", "moesim.sim.cli.real", "moesim.sim.cli.fit",
                "moesim.sim.study.fit")


def _modules_after(code: str) -> set[str]:
    """The modules loaded by a fresh interpreter after running ``code``."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_cli_loads_no_other_command_module() -> None:
    loaded = _modules_after("import moesim.sim.cli.main")
    assert not loaded & set(LAZY_MODULES)


def test_run_help_builds_no_other_command() -> None:
    loaded = _modules_after("from moesim.sim.cli.main import main\nmain(['run', '--help'])")
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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=60),
       st.sampled_from([0, 1, 25, 50, 75, 90, 99, 100]))
@example([math.inf], 0)          # numpy interpolates at the top end: inf - inf is NaN
@example([-0.0], 0)              # ... and keeps a lone -0.0
@example([-0.0, -0.0], 100)      # ... but not a -0.0 at the top of two
def test_percentile_is_numpys_bit_for_bit(values: list[float], p: int) -> None:
    a = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        want = np.float64(np.percentile(a, p))
    got = np.float64(percentile(np.sort(a), p))
    assert got.tobytes() == want.tobytes() or (np.isnan(got) and np.isnan(want))


def test_percentile_of_run_times_is_numpys() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 10, 499, 2000):
        a = rng.exponential(size=n) * 1e3
        for p in (50, 99):
            assert np.float64(percentile(np.sort(a), p)).tobytes() == np.float64(np.percentile(a, p)).tobytes()


@pytest.mark.parametrize(("argv", "expect"), [(["run", "s.yaml"], "4"), (["trace", "synth"], "4"),
                                              (["calibrate", "--out", "p.yaml"], None),
                                              (["validate", "s.yaml"], None)])
def test_blas_workers_sleep_unless_the_command_times_compute(argv: list[str], expect: str | None) -> None:
    code = ("import os\nfrom moesim.sim.cli.blas_spin import quiet_blas_workers\n"
            f"quiet_blas_workers({argv!r})\nimport numpy\nprint(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == str(expect)


def test_blas_setting_of_the_user_or_a_loaded_numpy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from moesim.sim.cli.blas_spin import quiet_blas_workers

    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    assert not quiet_blas_workers(["run"])     # numpy is loaded in this process: too late
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    code = "from moesim.sim.cli.blas_spin import quiet_blas_workers\nprint(quiet_blas_workers(['run']))"
    env = {**os.environ, "OPENBLAS_THREAD_TIMEOUT": "20"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "False"


def test_importing_the_cli_leaves_the_collector_as_it_was() -> None:
    code = ("import gc\n{}\nimport moesim.sim.cli.main\nprint(gc.isenabled())")
    for before, expect in (("", "True"), ("gc.disable()", "False")):
        out = subprocess.run([sys.executable, "-c", code.format(before)], capture_output=True, text=True,
                             check=True).stdout
        assert out.strip() == expect


def test_importing_the_cli_freezes_what_it_imported_unless_the_collector_was_off() -> None:
    # the import's ~30,000 objects are not left for the first young-generation pass to go over
    code = ("import gc\n{}\nimport moesim.sim.cli.main\nprint(gc.get_freeze_count())")
    for before in ("", "gc.disable()"):
        out = subprocess.run([sys.executable, "-c", code.format(before)], capture_output=True, text=True,
                             check=True).stdout
        frozen = int(out.strip())
        assert (frozen > 10_000) if not before else (frozen == 0), (before, frozen)


def test_a_command_scans_no_pydantic_plugins_unless_the_user_set_the_switch() -> None:
    code = ("import os\nfrom moesim.sim.cli.main import main\nassert main(['models']) == 0\n"
            "import pydantic.plugin._loader as loader\n"
            "print(loader._plugins is None, repr(os.environ.get('PYDANTIC_DISABLE_PLUGINS')))")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.splitlines()[-1] == "True None"      # never scanned; the switch taken back after the command
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "PYDANTIC_DISABLE_PLUGINS": ""}).stdout
    assert out.splitlines()[-1] == "False ''"       # the user's setting (every plugin) kept: scanned
