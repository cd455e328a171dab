"""Every notebook under notebooks/ executes headless from an unrelated working directory, shows
its figures inline and writes nothing into the source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.util import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.setenv("MOESIM_OUTPUTS", str(tmp_path / "outputs"))
    before = sorted(p.name for p in path.parent.iterdir())
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors[0].get("evalue")
    assert any("image/png" in o.get("data", {}) for o in outputs), "no inline figure"
    assert sorted(p.name for p in path.parent.iterdir()) == before  # nothing written next to the notebook
    assert not list(cwd.iterdir())                                   # nor into the working directory
    assert list((tmp_path / "outputs").rglob("*.png"))


def test_the_readme_notebook_command_comes_with_the_dev_extra() -> None:
    """Issue 35: the README runs notebooks with `jupyter nbconvert`, which the dev extra did not
    install. The extra names it, and the command the README gives is installed here."""
    import importlib.util
    import re
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    readme = (ROOT / "README.md").read_text()
    assert "jupyter nbconvert --to notebook --execute notebooks/" in readme
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(re.match(r"nbconvert\b", d) for d in dev), dev
    assert importlib.util.find_spec("nbconvert") is not None
