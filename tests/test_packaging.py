"""The install lists every folder of the package: a subpackage missing from
``[tool.setuptools] packages`` is silently absent from a non-editable ``pip install .``
(editable installs hide the mistake, so only this test catches it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML through tomli when it is there
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_source_folder_is_a_listed_package() -> None:
    cfg = _config()
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    missing = []
    for pkg, folder in dirs.items():
        for d in sorted((ROOT / folder).rglob("*")):
            if not d.is_dir() or d.name == "__pycache__":
                continue
            if not any(f.is_file() and f.suffix != ".pyc" for f in d.iterdir()):
                continue
            name = pkg + "." + ".".join(d.relative_to(ROOT / folder).parts)
            if name not in listed:
                missing.append(name)
    assert not missing, f"folders not in [tool.setuptools] packages: {missing}"


def test_data_files_are_declared() -> None:
    cfg = _config()
    data = cfg["package-data"]
    for pkg, folder in (("moesim.sim.catalog", "sim/catalog"), ("moesim.traces.samples", "traces/samples")):
        patterns = data[pkg]
        for f in (ROOT / folder).iterdir():
            if f.is_file() and f.suffix not in (".py", ".pyc"):
                assert any(f.match(p) for p in patterns), f"{f} is not shipped by package-data {patterns}"
