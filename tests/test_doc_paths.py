"""Every repository path that README.md and docs/*.md name exists: a backticked name with a
``/`` ending in .py, .yaml, .md, .parquet, .ipynb, .csv or .json, read from the repository
root (``moesim/sim/...`` is the installed name of ``sim/...``). Placeholders for the user's
own files (``runs/...``, ``OUT/...``, ``DIR/...``, ``my_...``, absolute and home paths) are
not paths of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMED = re.compile(r"`([A-Za-z0-9_./-]+\.(?:py|yaml|md|parquet|ipynb|csv|json))`")
PLACEHOLDERS = ("runs/", "OUT", "DIR", "/", "~", "my", "out/", "src/")


def named_paths(text: str) -> list[str]:
    """The repository paths a document names (see the module docstring)."""
    out = []
    for m in NAMED.finditer(text):
        path = m.group(1).removeprefix("moesim/")
        if "/" in path and not path.startswith(PLACEHOLDERS):
            out.append(path)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_named_path_exists(doc: Path) -> None:
    stale = sorted({p for p in named_paths(doc.read_text(encoding="utf-8")) if not (ROOT / p).exists()})
    assert not stale, f"{doc.relative_to(ROOT)} names paths the repository does not have: {stale}"


def test_the_check_reads_names_as_the_docs_write_them() -> None:
    text = ("see `sim/fast/path.py`, `moesim/policies/parts/caches.py` and `parts/gone.py`; "
            "write `runs/x/metrics.json` or `OUT/a.csv`; `simctl run` and `README.md` are no paths")
    assert named_paths(text) == ["sim/fast/path.py", "policies/parts/caches.py", "parts/gone.py"]
    assert not (ROOT / "parts/gone.py").exists()   # a stale name like it fails the test above
