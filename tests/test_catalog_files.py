"""The catalog files read entry by entry (:mod:`moesim.sim.config.catalog.files`) give the same
entries as the whole file parsed at once: every shipped file, and the files that must be read
whole (a top-level line that is not ``name:``, a name given twice, an entry that does not parse
alone)."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from moesim.sim.config.catalog.files import CatalogEntries, raw_entries, split_entries


def _parsed_whole(text: str) -> dict[str, dict[str, object]]:
    data = yaml.safe_load(text) or {}
    return {str(k): dict(v) for k, v in data.items()}


@pytest.mark.parametrize("kind", ["models", "hardware", "runtime", "hosts"])
def test_shipped_file_read_by_entry_equals_the_whole_file(kind: str) -> None:
    text = resources.files("moesim.sim.config.catalog").joinpath(f"{kind}.yaml").read_text()
    assert split_entries(text) is not None          # read entry by entry, not whole
    entries = raw_entries(kind)
    whole = _parsed_whole(text)
    assert list(entries) == list(whole)             # the same names, in file order
    assert {name: entries[name] for name in entries} == whole
    assert len(entries) == len(whole) and "no-such-entry" not in entries


def test_only_the_entry_read_is_parsed() -> None:
    entries = CatalogEntries("# header\na:\n  x: 1\n  # note\n\nb:\n  y: [1, 2]\nc:\n  z: {broken\n")
    assert list(entries) == ["a", "b", "c"] and "c" in entries
    assert entries["b"] == {"y": [1, 2]} and entries["a"] == {"x": 1}
    with pytest.raises(KeyError):
        entries["d"]
    with pytest.raises(yaml.YAMLError):   # the whole file is parsed when an entry does not parse alone
        entries["c"]


@pytest.mark.parametrize("text", [
    "---\na:\n  x: 1\n",                       # a document marker
    "a:\n  x: 1\nb: {y: 2}\n",                  # an entry on its key's line
    "a:\n  x: 1\na:\n  x: 2\n",                 # a name given twice: the last wins, as in the whole file
    "'a b':\n  x: 1\n",                         # a quoted name
])
def test_other_files_are_read_whole(text: str) -> None:
    assert split_entries(text) is None
    entries = CatalogEntries(text)
    assert dict(entries) == _parsed_whole(text)


def test_an_entry_that_needs_another_is_read_with_the_whole_file() -> None:
    text = "a:\n  x: &one 1\nb:\n  y: *one\n"
    assert split_entries(text) is not None
    entries = CatalogEntries(text)
    assert entries["b"] == {"y": 1} and entries["a"] == {"x": 1}
