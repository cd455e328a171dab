"""The error bands of ``simctl advise``: the committed table is what ``benchmarks/advise_bands.py``
computes from the repo's published rows and predictions (fast: it reads committed files, runs
nothing), and a band picks the nearest rows as documented."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.advise_bands import OUT, table_text
from moesim.sim.study.advise_bands import TABLE, Band, catalog_band, fit_band, gpu_class, load_table


def test_committed_table_is_what_the_script_computes() -> None:
    assert OUT.resolve() == TABLE.resolve()
    assert OUT.read_text() == table_text(), "run python benchmarks/advise_bands.py and commit sim/study/advise_bands.csv"


def _row(system: str, cls: str, ratio: float, prediction: str = "catalog", counted: str = "yes") -> dict[str, str]:
    return {"system": system, "gpu_class": cls, "speed_ratio": str(ratio), "prediction": prediction, "counted": counted}


TABLE_ROWS = (_row("accelerate", "gddr", 0.5), _row("accelerate", "gddr", 1.2), _row("accelerate", "hbm", 0.4),
              _row("accelerate", "gddr", 0.1, counted="no: typo"), _row("lru", "hbm", 1.05, "fitted"),
              _row("lru", "gddr", 0.95, "fitted"))


def test_band_prefers_the_same_gpu_class() -> None:
    b = catalog_band("accelerate", "accelerate", "gddr", TABLE_ROWS)
    assert (b.lo, b.hi, b.rows) == (0.5, 1.2, 2) and "2 published accelerate rows on GDDR GPUs" in b.words
    assert b.short() == "0.50-1.20x (2 rows)"
    assert b.interval(12.0, 0.01) == pytest.approx((10.0, 24.0))


def test_band_falls_back_to_other_classes_and_says_so() -> None:
    b = catalog_band("accelerate", "accelerate", "unknown", TABLE_ROWS)
    assert (b.lo, b.hi, b.rows) == (0.4, 1.2, 3) and "none on GPUs of unknown class" in b.words


def test_no_catalog_rows_is_no_band() -> None:
    b = catalog_band("lru", "expert cache (lru)", "hbm", TABLE_ROWS)
    assert not b.known and b.short() == "none published"
    assert "no published expert cache (lru) rows at the catalog's figures (2 predicted after fitting" in b.words
    assert "0.95-1.05x" in b.words
    none = catalog_band("cpu-moe", "llama.cpp", "hbm", TABLE_ROWS)
    assert none == Band(None, None, 0, "no published llama.cpp rows")
    assert none.interval(10.0, 0.01) == pytest.approx((10 / 1.01, 10.1))


def test_gpu_classes_of_the_catalog() -> None:
    from moesim.sim.config.catalog import get_hardware

    assert [gpu_class(get_hardware(n).hbm_gbps) for n in ("a100-sxm-80gb", "h100-sxm", "h20", "rtx-4090", "l4", "t4")] \
        == ["hbm", "hbm", "hbm", "gddr", "gddr", "gddr"]


def test_committed_rows_have_the_columns() -> None:
    rows = load_table()
    assert rows and all(r["counted"] == "yes" or r["counted"].startswith("no: ") for r in rows)
    assert {r["prediction"] for r in rows} <= {"catalog", "fitted"}


def test_fit_band_is_the_fits_own_held_out_error(tmp_path) -> None:
    """A fit folder's held-out speed rows (BuddyMoE: 11 rows, 0.93-1.13x since its refit on the
    fitted routing); the fit file alone: its max ratio either way."""
    import shutil

    from benchmarks.advise_bands import FITS

    fitted = FITS / "buddymoe-tables2-4" / "fitted.yaml"
    b = fit_band(str(fitted))
    assert b is not None and b.rows == 11 and (round(b.lo, 3), round(b.hi, 3)) == (0.926, 1.125)
    assert "held-out speed rows of fit" in b.words
    alone = tmp_path / "fitted.yaml"
    shutil.copy(fitted, alone)
    b2 = fit_band(str(alone))
    assert b2 is not None and b2.hi == pytest.approx(1.1254) and b2.lo == pytest.approx(1 / 1.1254)
    (tmp_path / "other.yaml").write_text("name: x\n")
    assert fit_band(str(tmp_path / "other.yaml")) is None


def test_a_new_set_without_a_fit_folder_is_named(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A measurement set with no committed fit folder gets an uncounted row naming the command."""
    import benchmarks.advise_bands as ab

    (tmp_path / "new-set.yaml").write_text("name: new-set\n")
    monkeypatch.setattr(ab, "MEASUREMENTS", tmp_path)
    rows = ab.unfitted_rows()
    assert [r["set"] for r in rows] == ["new-set"]
    assert rows[0]["counted"].startswith("no: no committed fit folder (simctl fit measurements/new-set.yaml")


def test_a_declared_system_groups_the_row_not_its_stand_in_policy(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A file's ``system:`` is every row's, a row's own overrides it, and a row with neither is
    its policy's: a kTransformers row that runs ``cpu-moe`` never lands in llama.cpp's band."""
    import benchmarks.advise_bands as ab

    rows = [{"set": {"policy": "cpu-moe"}, "tokens_per_s": 2.0, "role": "test"},
            {"set": {"policy": "cpu-moe"}, "tokens_per_s": 2.0, "role": "test", "system": "fiddler"}]
    fits, meas = tmp_path / "fits", tmp_path / "measurements"
    (fits / "s").mkdir(parents=True)
    meas.mkdir()
    (fits / "s" / "rows.csv").write_text(
        "row,role,metric,measured,predicted,set,relative_to\n"
        '0,test,tokens_per_s,2.0,3.0,"{""policy"": ""cpu-moe""}",\n'
        '1,test,tokens_per_s,2.0,1.0,"{""policy"": ""cpu-moe""}",\n')
    monkeypatch.setattr(ab, "FITS", fits)
    monkeypatch.setattr(ab, "MEASUREMENTS", meas)
    for file_system, want in ((None, ["cpu-moe", "fiddler"]), ("ktransformers", ["ktransformers", "fiddler"])):
        doc = {"name": "s", "base": {"hardware": "rtx-4090"}, "rows": rows}
        if file_system:
            doc["system"] = file_system
        (meas / "s.yaml").write_text(yaml.safe_dump(doc))
        got = ab.fit_rows()
        assert [r["system"] for r in got] == want
        assert [r["speed_ratio"] for r in got] == [1.5, 0.5]


def test_the_kTransformers_sets_are_not_llama_cpp_rows() -> None:
    """Every committed row of a kTransformers set is judged as kTransformers', except the SOSP
    '25 set's Fiddler and llama.cpp rows, which name their own systems."""
    table = load_table()
    systems = {(r["set"], r["system"]) for r in table if r["set"].startswith("ktransformers-")}
    assert ("ktransformers-sosp25-decode", "fiddler") in systems
    assert ("ktransformers-sosp25-decode", "cpu-moe") in systems
    assert {s for _, s in systems} == {"ktransformers", "fiddler", "cpu-moe"}
    assert all(s != "cpu-moe" for name, s in systems if name != "ktransformers-sosp25-decode")
