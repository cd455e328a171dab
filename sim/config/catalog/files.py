"""The catalog files shipped beside this module (``models.yaml``, ``hardware.yaml``,
``runtime.yaml``, ``hosts.yaml``): read once each, and the one-line error for a name that is
not in one.

A run names one model, one GPU and one runtime of catalogs of dozens: a file is cut into its
top-level entries (each a ``name:`` line at the left margin and the indented block under it)
and an entry is parsed when it is first read (0.1 ms), not the whole file (~11 ms of CPU a
``simctl run`` for the four files, with libyaml). A file that is not such a plain list of
entries (a top-level line of another shape, a name given twice) is parsed whole, as an entry
whose block does not parse alone to one mapping is; the entries are the same either way
(``tests/test_catalog_files.py`` checks every shipped file both ways).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

from moesim.sim.core.errors import MoesimError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML has it (45 ms -> 5 ms a run for the shipped catalog)."""

_TOP = re.compile(r"^(?![ \t#\r\n])(.+)$", re.M)
"""A line at the left margin that is not a comment: a top-level key (or other top-level YAML)."""

_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.+-]*):[ \t]*(?:#.*)?\r?")
"""A top-level line that opens an entry: a plain name, a colon, nothing after it but a comment."""


class CatalogError(MoesimError, ValueError):
    """Unknown catalog name or invalid entry; the message is one line."""


def _whole(text: str) -> dict[str, dict[str, Any]]:
    data = yaml.load(text, Loader=_LOADER) or {}
    return {str(k): dict(v) for k, v in data.items()}


def split_entries(text: str) -> dict[str, str] | None:
    """The YAML text of each top-level entry of a catalog file, by name, in file order; None
    where the file is not a plain list of ``name:`` blocks (then it is parsed whole)."""
    out: dict[str, str] = {}
    name: str | None = None
    start = 0
    for m in _TOP.finditer(text):
        key = _NAME.fullmatch(m.group(1))
        if key is None or key.group(1) in out or key.group(1) == name:
            return None
        if name is not None:
            out[name] = text[start:m.start()]
        name, start = key.group(1), m.start()
    if name is not None:
        out[name] = text[start:]
    return out


class CatalogEntries(Mapping[str, dict[str, Any]]):
    """The entries of one catalog file, name -> fields, each parsed when first read."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._blocks = split_entries(text)
        self._parsed: dict[str, dict[str, Any]] = {} if self._blocks is not None else _whole(text)

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._parsed:
            if self._blocks is None or name not in self._blocks:
                raise KeyError(name)
            try:
                data = yaml.load(self._blocks[name], Loader=_LOADER)
            except yaml.YAMLError:   # an alias of an anchor in another entry, say
                data = None
            if not isinstance(data, dict) or list(data) != [name]:   # not one mapping alone: the whole file
                self._parsed, self._blocks = _whole(self._text), None
                return self._parsed[name]
            self._parsed[name] = dict(data[name])
        return self._parsed[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed if self._blocks is None else self._blocks)

    def __len__(self) -> int:
        return len(self._parsed if self._blocks is None else self._blocks)

    def __contains__(self, name: object) -> bool:
        return name in (self._parsed if self._blocks is None else self._blocks)


@cache
def raw_entries(kind: str) -> Mapping[str, dict[str, Any]]:
    """The entries of catalog file ``kind`` (``models``, ``hardware``, ``runtime``, ``hosts``)
    as plain mappings, name -> fields."""
    return CatalogEntries(resources.files(__package__).joinpath(f"{kind}.yaml").read_text())


def unknown(kind: str, name: str, names: list[str]) -> CatalogError:
    """The error for ``name`` missing from a catalog of ``names``, with the closest name."""
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(names))}"
    return CatalogError(f"unknown {kind} {name!r}{hint}")
