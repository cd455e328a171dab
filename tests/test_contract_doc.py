"""docs/contract.md gives one example of every hook of :class:`~moesim.policies.contract.base.Policy`,
each with the hook's signature as base.py declares it (names, annotations, return type), so
that the page cannot drift from the contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "### Every hook, by example"


def hooks() -> dict[str, ast.FunctionDef]:
    """The methods of ``Policy`` under its ``# -- hooks`` comment, by name."""
    src = (ROOT / "policies/contract/base.py").read_text()
    start = next(i for i, line in enumerate(src.splitlines(), 1) if line.strip().startswith("# -- hooks"))
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "Policy")
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef) and f.lineno > start}


def examples() -> list[ast.FunctionDef]:
    """The functions of the section's code blocks, in order."""
    text = (ROOT / "docs/contract.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n### ", 1)]
    out = []
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        body = ast.parse(block).body
        assert len(body) == 1 and isinstance(body[0], ast.FunctionDef), block
        out.append(body[0])
    return out


def signature(f: ast.FunctionDef) -> tuple[list[tuple[str, str]], str]:
    args = [(a.arg, ast.unparse(a.annotation) if a.annotation else "") for a in f.args.args]
    return args, ast.unparse(f.returns) if f.returns else ""


def test_every_hook_has_one_example_with_its_signature() -> None:
    declared, shown = hooks(), examples()
    assert len(declared) == 17, sorted(declared)
    names = [f.name for f in shown]
    assert sorted(names) == sorted(declared) and len(set(names)) == len(names), names
    for f in shown:
        assert signature(f) == signature(declared[f.name]), f.name

