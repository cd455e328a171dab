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


def _folders() -> list[tuple[str, Path]]:
    """(import name, folder) of every folder under the mapped source folders."""
    out = []
    for pkg, folder in _config()["package-dir"].items():
        root = ROOT / folder
        out.append((pkg, root))
        for d in sorted(root.rglob("*")):
            if d.is_dir() and d.name != "__pycache__":
                out.append((pkg + "." + ".".join(d.relative_to(root).parts), d))
    return out


def test_every_code_folder_is_a_listed_package() -> None:
    listed = set(_config()["packages"])
    missing = [name for name, d in _folders() if any(d.glob("*.py")) and name not in listed]
    assert not missing, f"folders with code not in [tool.setuptools] packages: {missing}"


def test_every_data_file_is_shipped() -> None:
    """Each file that is not code matches a package-data pattern of its nearest listed package."""
    cfg = _config()
    listed, data = set(cfg["packages"]), cfg["package-data"]
    folders = dict(_folders())
    unshipped = []
    for name, d in folders.items():
        for f in d.iterdir():
            if not f.is_file() or f.suffix in (".py", ".pyc"):
                continue
            owner = name
            while owner not in listed:
                owner = owner.rsplit(".", 1)[0]
            rel = f.relative_to(folders[owner]).as_posix()
            if not any(Path(rel).match(p) and rel.count("/") == p.count("/") for p in data.get(owner, [])):
                unshipped.append(rel if owner == name else f"{owner}: {rel}")
    assert not unshipped, f"files no package-data pattern ships: {unshipped}"
