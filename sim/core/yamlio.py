"""Reading user YAML files strictly: every problem is one line naming the file and line.

``yaml.safe_load`` lets the last of two equal keys win without a word and reports bad UTF-8
by byte offset; :func:`load_yaml_file` refuses duplicate keys (naming both lines) and names
the line of an undecodable byte. Scenario, sweep and hardware/runtime profile files all read
through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.limits import YAML_BYTES


class YamlError(MoesimError, ValueError):
    """A YAML file that cannot be read; the message names the file and the line."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    loader.flatten_mapping(node)
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:   # an unhashable key: let the base constructor report it
            break
        line = key_node.start_mark.line + 1
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (lines {first} and {line})", key_node.start_mark)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1}" if mark is not None else ""


def loads(text: str, source: str) -> Any:
    """Parse YAML text strictly; errors are :class:`YamlError` naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise YamlError(f"{source}:{_where(exc)}: {problem}") from None
    except RecursionError:
        raise YamlError(f"{source}: nested too deeply to read") from None


def load_yaml_file(path: str | Path) -> Any:
    """Read and parse a YAML file strictly (UTF-8; duplicate keys refused; no larger than
    :data:`moesim.sim.core.limits.YAML_BYTES`)."""
    p = Path(path)
    if not p.exists():
        raise YamlError(f"{p}: no such file")
    if p.is_dir():
        raise YamlError(f"{p}: is a directory, not a YAML file")
    try:
        YAML_BYTES.check(p.stat().st_size, str(p))
        raw = p.read_bytes()
    except OSError as exc:
        raise YamlError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlError(f"{p}: line {line}: not UTF-8 (byte 0x{raw[exc.start]:02x})") from None
    return loads(text, str(p))
