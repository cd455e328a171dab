"""``--set KEY=VALUE`` overrides of a scenario: parsing one, and setting a dotted key in the raw
scenario mapping as the command line, sweeps and fits do."""

from __future__ import annotations

from typing import Any

import yaml

from moesim.sim.config.catalog import is_spec_file
from moesim.sim.config.scenario_error import ScenarioError


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in item:
        raise ScenarioError(f"--set {item!r}: expected KEY=VALUE")
    key, _, raw = item.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ScenarioError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def set_key(data: dict[str, Any], path: list[str], value: Any, label: str) -> None:
    """Set the dotted scenario key ``path`` to ``value`` in the raw mapping ``data`` (in place),
    as ``--set`` does; ``label`` names the change in an error (``--set a.b=1``).

    A catalog name on the way (``hardware: rtx-4090``) becomes ``{base: rtx-4090}``, a policy
    name ``{name: ...}``; setting one of the mutually exclusive cache sizes drops the others.
    """
    node: Any = data
    for i, part in enumerate(path[:-1]):
        nxt = node.get(part)
        if isinstance(nxt, str) and part in ("model", "hardware", "runtime") and node is data:
            if is_spec_file(nxt):
                raise ScenarioError(f"{label}: {part} is the file {nxt}; put the change in that file, "
                                    f"or name a catalog entry as {part}")
            nxt = {"base": nxt}
            node[part] = nxt
        elif isinstance(nxt, str) and part == "policy" and node is data:
            nxt = {"name": nxt}
            node[part] = nxt
        elif nxt is None:
            nxt = {}
            node[part] = nxt
        elif not isinstance(nxt, dict):
            raise ScenarioError(f"{label}: {'.'.join(path[:i + 1])} is not a mapping")
        node = nxt
    last = path[-1]
    if path[:-1] == ["cache"] and last in ("rate", "experts_per_layer", "gib"):
        for other in ("rate", "experts_per_layer", "gib"):
            node.pop(other, None)
    node[last] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to the raw scenario mapping (in place; returns it).

    Setting one of the mutually exclusive cache sizes drops the others, so
    ``--set cache.rate=0.25`` works on a scenario written with ``experts_per_layer``.
    """
    for item in overrides:
        path, value = parse_override(item)
        set_key(data, path, value, f"--set {item}")
    return data
