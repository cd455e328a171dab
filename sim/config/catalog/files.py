"""The catalog files shipped beside this module (``models.yaml``, ``hardware.yaml``,
``runtime.yaml``, ``hosts.yaml``): read once each, and the one-line error for a name that is
not in one."""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from typing import Any

import yaml

from moesim.sim.core.errors import MoesimError


class CatalogError(MoesimError, ValueError):
    """Unknown catalog name or invalid entry; the message is one line."""


def _load(kind: str) -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(f"{kind}.yaml").read_text()
    # libyaml's safe loader where PyYAML has it (45 ms -> 5 ms a run for the shipped catalog)
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return {str(k): dict(v) for k, v in data.items()}


@cache
def raw_entries(kind: str) -> dict[str, dict[str, Any]]:
    """The entries of catalog file ``kind`` (``models``, ``hardware``, ``runtime``, ``hosts``)
    as plain mappings, name -> fields."""
    return _load(kind)


def unknown(kind: str, name: str, names: list[str]) -> CatalogError:
    """The error for ``name`` missing from a catalog of ``names``, with the closest name."""
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(names))}"
    return CatalogError(f"unknown {kind} {name!r}{hint}")
