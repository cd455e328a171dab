"""The published real-system measurement sets of issue 32 item 3 (benchmarks/real_systems.py's
SETS): each file states its rule for roles in its header, every row is cited to an address
and a place in it (table, row, line, section), and the MoE-Infinity README's order comes out
right at the catalog defaults. Schema, roles and that every row builds are
tests/test_measurement_sets.py's, which covers every file of measurements/."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from benchmarks.real_systems import SETS
from tests.util import ROOT

FOLDER = ROOT / "measurements"
PLACE = re.compile(r"\b(table|row|line|section|column)\b", re.IGNORECASE)
ADDRESS = re.compile(r"https?://\S+")


def _doc(stem: str) -> tuple[str, dict[str, Any]]:
    text = (FOLDER / f"{stem}.yaml").read_text()
    return text, yaml.safe_load(text)


def test_every_real_system_set_is_a_file_and_listed_in_the_readme() -> None:
    readme = (FOLDER / "README.md").read_text()
    for stem in SETS:
        assert (FOLDER / f"{stem}.yaml").exists(), stem
        assert f"`{stem}.yaml`" in readme, f"{stem} is not in measurements/README.md"


@pytest.mark.parametrize("stem", SETS)
def test_header_states_the_rule_for_roles(stem: str) -> None:
    text, doc = _doc(stem)
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "Rule for roles" in header and "before any fit" in header, f"{stem}: no rule for roles in the header"
    assert "assum" in doc["notes"].lower(), f"{stem}: the notes say nothing of what is assumed"


@pytest.mark.parametrize("stem", SETS)
def test_every_row_is_cited(stem: str) -> None:
    _, doc = _doc(stem)
    for i, row in enumerate(doc["rows"]):
        where = f"{stem} row {i}"
        source = row.get("source", "")
        assert ADDRESS.search(source), f"{where}: no address (URL) in its source"
        assert PLACE.search(source), f"{where}: its source names no table, row, line, column or section"
        assert row.get("role") in ("fit", "test"), where
        assert row.get("read_off") is False, f"{where}: read_off must be stated (false: a printed number)"


def test_moe_infinity_ahead_of_mixtral_offloading_at_the_catalog_defaults() -> None:
    """The README's order: MoE-Infinity (0.735 s per token) ahead of Mixtral Offloading (1.752 s),
    rows 0 and 3 of moe-infinity-readme.yaml run as the file writes them, nothing fitted."""
    from benchmarks.real_systems import run_data
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(FOLDER / "moe-infinity-readme.yaml")
    tpot = {}
    for i in (0, 3):
        spec = ms.rows[i]
        assert spec.measured == {"tpot_ms": (735.0, 1752.0)[i // 3]}
        tpot[i] = run_data(spec.data, base_dir=ms.base_dir, source=f"row {i}", fixed=tuple(spec.set))["tpot_ms"]["mean"]
    assert tpot[0] < tpot[3], tpot
