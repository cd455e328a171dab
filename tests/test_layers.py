"""The package's layers: every import (top-level, inside functions and under TYPE_CHECKING)
runs down the layers of ``sim/``, ``traces/`` and ``policies/``, never up or sideways.

    cli  >  study, real, testing  >  run  >  fast  >  engine  >  policies, traces  >  config  >  core

Two packages of one rank (``study`` and ``real``; ``policies`` and ``traces``) do not import
each other. ``traces/cli.py`` (the ``simctl trace`` commands) sits with the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANKS = [
    ("moesim.sim.core", 0),
    ("moesim.sim.config", 1),
    ("moesim.traces.cli", 8),
    ("moesim.traces", 2),
    ("moesim.policies", 2),
    ("moesim.sim.engine", 3),
    ("moesim.sim.fast", 4),
    ("moesim.sim.run", 5),
    ("moesim.sim.study", 6),
    ("moesim.sim.real", 6),
    ("moesim.testing", 6),
    ("moesim.sim.cli", 7),
]


def layer_of(module: str) -> tuple[str, int]:
    """The layer (package prefix, rank) a dotted module name belongs to."""
    for prefix, rank in RANKS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    raise LookupError(module)


def modules() -> list[tuple[str, Path]]:
    """Every module of the three folders, with its dotted name."""
    out = []
    for folder in ("sim", "traces", "policies", "testing"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append(("moesim." + ".".join(parts), path))
    return out


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``moesim`` import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moesim."):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("moesim.")]
    return found


MODULES = modules()


def test_every_module_has_a_layer() -> None:
    for name, _ in MODULES:
        if name in ("moesim.sim", "moesim.traces", "moesim.policies", "moesim.traces.samples"):
            continue
        layer_of(name)


@pytest.mark.parametrize("name,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_run_down_the_layers(name: str, path: Path) -> None:
    if name in ("moesim.sim", "moesim.traces", "moesim.policies", "moesim.traces.samples"):
        return
    own, rank = layer_of(name)
    bad = []
    for line, target in imports(path):
        other, other_rank = layer_of(target)
        if other_rank > rank or (other_rank == rank and other != own):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({other} above {own})")
    assert not bad, "\n".join(bad)


def test_a_lower_layer_that_imports_a_higher_one_is_caught(tmp_path: Path) -> None:
    """The check itself: an engine module importing the fast path is a violation."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from moesim.sim.fast.path import FAST_PATH\n")
    (line, target), = imports(bad)
    assert layer_of(target)[1] > layer_of("moesim.sim.engine.event_loop")[1]
