"""The error bands of ``simctl advise``: the committed table is what ``benchmarks/advise_bands.py``
computes from the repo's published rows and predictions (fast: it reads committed files, runs
nothing), and a band picks the nearest rows as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.advise_bands import OUT, table_text
from moesim.sim.study.advise_bands import TABLE, Band, catalog_band, fit_band, gpu_class, load_table


def test_committed_table_is_what_the_script_computes() -> None:
    assert OUT.resolve() == TABLE.resolve()
    assert OUT.read_text() == table_text(), "run python benchmarks/advise_bands.py and commit sim/study/advise_bands.csv"


def _row(system: str, cls: str, ratio: float, prediction: str = "catalog", counted: str = "yes",
         runtime: str = "hf-eager") -> dict[str, str]:
    return {"system": system, "gpu_class": cls, "speed_ratio": str(ratio), "prediction": prediction, "counted": counted,
            "runtime": runtime}


TABLE_ROWS = (_row("accelerate", "gddr", 0.5), _row("accelerate", "gddr", 1.2), _row("accelerate", "hbm", 0.4, runtime="hqq"),
              _row("accelerate", "gddr", 0.1, counted="no: typo"), _row("lru", "hbm", 1.05, "fitted"),
              _row("lru", "gddr", 0.95, "fitted", runtime="imp"))


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


def test_band_keeps_to_the_rows_of_the_options_runtime() -> None:
    """Given a runtime some of the system's counted rows ran: only those (the uncounted one stays
    out), then the class rule within them, and the words say so."""
    b = catalog_band("accelerate", "accelerate", "hbm", TABLE_ROWS, runtime="hf-eager")
    assert (b.lo, b.hi, b.rows) == (0.5, 1.2, 2)
    assert b.words == "on 2 published accelerate rows run as hf-eager, none on HBM data-centre GPUs (theirs: GDDR GPUs)"
    b = catalog_band("accelerate", "accelerate", "hbm", TABLE_ROWS, runtime="hqq")
    assert (b.lo, b.hi, b.rows) == (0.4, 0.4, 1) and b.words == "on 1 published accelerate row run as hqq on HBM data-centre GPUs"
    b = catalog_band("lru", "expert cache (lru)", "hbm", TABLE_ROWS, runtime="imp")
    assert not b.known and b.words.startswith("no published expert cache (lru) rows run as imp at the catalog's figures "
                                              "(1 predicted after fitting to their own testbed: 0.95-0.95x")


def test_band_of_a_runtime_no_row_ran_is_every_row_and_says_so() -> None:
    """No row ran the runtime: the band is the one without it, its words end by saying so; a
    system with no rows at all says only that."""
    for cls in ("hbm", "gddr", "unknown"):
        plain, other = catalog_band("accelerate", "accelerate", cls, TABLE_ROWS), \
            catalog_band("accelerate", "accelerate", cls, TABLE_ROWS, runtime="vllm-like")
        assert (other.lo, other.hi, other.rows) == (plain.lo, plain.hi, plain.rows)
        assert other.words == plain.words + "; none with runtime vllm-like"
    lru = catalog_band("lru", "expert cache (lru)", "hbm", TABLE_ROWS, runtime="vllm-like")
    assert lru.words == catalog_band("lru", "expert cache (lru)", "hbm", TABLE_ROWS).words + "; none with runtime vllm-like"
    assert catalog_band("cpu-moe", "llama.cpp", "hbm", TABLE_ROWS, runtime="x") == Band(None, None, 0, "no published llama.cpp rows")


def test_committed_rows_name_their_runtime() -> None:
    """A row's own runtime (the SOSP '25 set's Fiddler and llama.cpp rows), else its set's base
    scenario's (its kTransformers rows: the artifact's runtime; the EPYC set's: v0.2), else the
    scenario default; published_systems.md's rows the runtime that script ran them with."""
    by = {(r["set"], r["row"]): r["runtime"] for r in load_table()}
    assert by["ktransformers-sosp25-decode", "6"] == "hf-eager"          # set: runtime: {base: hf-eager, ...}
    assert by["ktransformers-sosp25-decode", "9"] == "llama-cpp-like"    # set: runtime: {base: llama-cpp-like, ...}
    assert by["ktransformers-sosp25-decode", "0"] == "ktransformers-sosp25"
    assert by["ktransformers-epyc9654-deepseek-r1", "0"] == "ktransformers-v0.2"
    assert {v for (name, _), v in by.items() if name == "buddymoe-tables2-4"} == {"none"}   # its base names none
    published = [r for r in load_table() if r["source"] == "benchmarks/results/published_systems.md"]
    assert {r["runtime"] for r in published if r["set"].startswith("Eliseev")} == {"hf-eager-hqq"}
    assert {r["runtime"] for r in published if not r["set"].startswith("Eliseev")} == {"hf-eager"}


def test_runtime_names(tmp_path: Path) -> None:
    """How a ``runtime:`` value is named: a catalog name, a base with overrides, a file (from the
    repository root; its name outside it), a spec without a base (its name), nothing."""
    from benchmarks.advise_bands import MEASUREMENTS, runtime_name

    assert runtime_name("hf-eager", MEASUREMENTS) == "hf-eager"
    assert runtime_name({"base": "llama-cpp-like", "kv_on_host": True}, MEASUREMENTS) == "llama-cpp-like"
    fitted = "../benchmarks/results/fits/moe-infinity-readme/fitted.yaml"
    assert runtime_name(fitted, MEASUREMENTS) == "benchmarks/results/fits/moe-infinity-readme/fitted.yaml"
    assert runtime_name({"base": fitted}, MEASUREMENTS) == "benchmarks/results/fits/moe-infinity-readme/fitted.yaml"
    assert runtime_name("rt.yaml", tmp_path) == "rt.yaml"
    assert runtime_name({"name": "mine", "layer_us": 5}, MEASUREMENTS) == "mine"
    assert runtime_name({"layer_us": 5}, MEASUREMENTS) == runtime_name(None, MEASUREMENTS) == ""


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
        assert [r["runtime"] for r in got] == ["none", "none"]      # the scenario default


def test_the_kTransformers_sets_are_not_llama_cpp_rows() -> None:
    """Every committed row of a kTransformers set is judged as kTransformers', except the SOSP
    '25 set's Fiddler and llama.cpp rows, which name their own systems."""
    table = load_table()
    systems = {(r["set"], r["system"]) for r in table if r["set"].startswith("ktransformers-")}
    assert ("ktransformers-sosp25-decode", "fiddler") in systems
    assert ("ktransformers-sosp25-decode", "cpu-moe") in systems
    assert {s for _, s in systems} == {"ktransformers", "fiddler", "cpu-moe"}
    assert all(s != "cpu-moe" for name, s in systems if name != "ktransformers-sosp25-decode")
