"""Install hints name the checkout, not a package index moesim is not on (issue 35)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from moesim.sim.core.install_hint import extra_hint

ROOT = Path(__file__).resolve().parents[1]


def test_the_hint_installs_from_the_checkout() -> None:
    assert extra_hint("sweep") == "pip install -e '.[sweep]' in your moesim checkout (moesim is not on a package index)"
    assert extra_hint("tracer", torch=True).startswith("pip install 'torch==2.13.0' && pip install -e '.[tracer]' ")


def test_no_source_names_moesim_on_an_index() -> None:
    """No message in the sources tells pip to fetch ``moesim[...]`` (or ``moesim``) from an index
    (as five did: ``pip install 'moesim[tracer]'``)."""
    pattern = re.compile(r"pip install (-U )?['\"]?moesim\b")
    found = [f"{p.relative_to(ROOT)}:{i}" for top in ("sim", "traces", "policies")
             for p in (ROOT / top).rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_dask_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from moesim.sim.study.sweep_run import SweepError, _dask

    monkeypatch.setitem(sys.modules, "distributed", None)   # makes "import distributed" fail
    hint = re.escape("--dask needs dask.distributed: pip install -e '.[sweep]' in your")
    with pytest.raises(SweepError, match=hint), _dask("local:1"):
        pass
