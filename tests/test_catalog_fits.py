"""The catalog's fitted entries equal the committed fits (``benchmarks/sync_catalog_fits.py``
writes them): a refit that is not synced, or a catalog number edited by hand, fails here."""

from __future__ import annotations

from benchmarks.sync_catalog_fits import FITTED, _rows, differences, expected


def test_catalog_equals_committed_fits() -> None:
    assert differences() == []


def test_every_fitted_field_has_a_source_naming_its_fit() -> None:
    for f in FITTED:
        value, source = expected()[(f.catalog, f.entry, f.field)]
        assert value > 0
        assert source.startswith("fit: `simctl fit measurements/") and f.fit in source
        assert "held-out" in source


def test_row_ranges() -> None:
    assert _rows([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"
    assert _rows([4]) == "4"
