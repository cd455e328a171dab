"""The harness of the bad-input corpus (``tests/test_bad_input.py``, ``tests/test_bad_traces.py``).

Each case runs ``simctl`` in-process and must end with exit status 2, exactly one line on
stderr that starts ``simctl: error:`` and names the culprit (the case's ``culprit`` strings:
file, row or column, YAML path, option), no traceback, and nothing written: the folder the case
runs in holds the same files afterwards as before (no half-written output, no hidden temporary
folder). Trace files with wrong Arrow types and values are built from the bundled sample.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from moesim.sim.cli.main import main
from tests.util import ROOT

SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
DELETE = object()


def base_scenario() -> dict[str, Any]:
    """The quickstart on 2 requests, with an absolute trace path (a valid scenario)."""
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    data["trace"] = str(SAMPLE)
    data["workload"]["requests"] = 2
    return data


def scen(**changes: Any) -> str:
    """YAML text of the base scenario with dotted keys (``cache__gib``) changed or deleted."""
    data = base_scenario()
    for key, value in changes.items():
        path = key.split("__")
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def small_table() -> pa.Table:
    """The first two requests of the sample (1024 rows), a valid trace."""
    return pq.read_table(SAMPLE).slice(0, 1024)


def write_trace(path: Path, table: pa.Table, meta: Any = "keep") -> None:
    """Write ``table`` with the sample's moe-trace metadata (or ``meta``: a dict, raw bytes, or
    None for none)."""
    sample_meta = pq.read_schema(SAMPLE).metadata
    if meta == "keep":
        md = sample_meta
    elif meta is None:
        md = None
    else:
        md = {b"moe_trace": meta if isinstance(meta, bytes) else json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(md), path)


def sample_meta() -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(pq.read_schema(SAMPLE).metadata[b"moe_trace"])
    return meta


def set_column(table: pa.Table, name: str, arr: pa.Array | pa.ChunkedArray) -> pa.Table:
    i = table.schema.get_field_index(name)
    if i < 0:
        return table.append_column(name, arr)
    return table.set_column(i, pa.field(name, arr.type), arr)


def mutate(name: str, fn: Callable[[list[Any]], list[Any]], type_: pa.DataType | None = None) -> Callable[[Path], None]:
    """A trace whose column ``name`` is ``fn(values)`` (of Arrow type ``type_``)."""
    def build(path: Path) -> None:
        t = small_table()
        values = fn(t.column(name).to_pylist())
        write_trace(path, set_column(t, name, pa.array(values, type=type_)))
    return build


def with_meta(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A trace whose metadata ``change`` edits in place (or replaces: a ``bytes`` answer)."""
    def build(path: Path) -> None:
        meta = sample_meta()
        out = change(meta)
        write_trace(path, small_table(), out if isinstance(out, bytes) else meta)
    return build


def drop_column(name: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        write_trace(path, small_table().drop_columns([name]))
    return build


def rows(fn: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        write_trace(path, fn(small_table()))
    return build


def renumber(col: str, fn: Callable[[int], int]) -> Callable[[Path], None]:
    return mutate(col, lambda v: [fn(x) for x in v], pa.int32())


def at(values: list[Any], index: int, value: Any) -> list[Any]:
    values = list(values)
    values[index] = value
    return values


Files = dict[str, "str | bytes | Callable[[Path], None]"]


@dataclass
class Case:
    """One bad input: files to create, the command line (``{tmp}`` is the case's folder), and
    the strings the error line must contain."""

    id: str
    argv: list[str]
    culprit: list[str]
    files: Files = field(default_factory=dict)
    needs: str | None = None    # an optional module the case needs


class Corpus:
    """A list of cases and the shorthands that add them."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def case(self, id: str, argv: str | list[str], *culprit: str, files: Files | None = None,
             needs: str | None = None) -> None:
        """Any command line."""
        self.cases.append(Case(id, argv.split() if isinstance(argv, str) else argv, list(culprit), files or {}, needs))

    def scenario_case(self, id: str, text: str | bytes, *culprit: str, extra: list[str] | None = None,
                      files: Files | None = None) -> None:
        """``simctl run s.yaml`` on a bad scenario file."""
        self.case(f"scenario-{id}", ["run", "{tmp}/s.yaml", *(extra or [])], *culprit,
                  files={"s.yaml": text, **(files or {})})

    def trace_case(self, id: str, build: Callable[[Path], None], *culprit: str, run: bool = True) -> None:
        """``simctl trace inspect`` and ``simctl run`` on a bad trace file: both name it (``run``
        False: the value is in a column an LRU run does not read, so only the inspection sees it)."""
        self.case(f"inspect-{id}", "trace inspect {tmp}/t.parquet", "t.parquet", *culprit, files={"t.parquet": build})
        if run:
            self.case(f"run-{id}", "run {tmp}/s.yaml", "t.parquet", *culprit,
                      files={"t.parquet": build, "s.yaml": scen(trace="t.parquet")})


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _make(root: Path, files: Files) -> None:
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(p)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def check(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run case ``c`` in ``tmp_path`` and assert the bad-input contract (see the module)."""
    if c.needs:
        pytest.importorskip(c.needs)
    _make(tmp_path, c.files)
    monkeypatch.chdir(tmp_path)          # default output folders (runs/...) land here too
    monkeypatch.delenv("MOESIM_ALLOW_PLUGINS", raising=False)   # --allow-plugins sets it: undone after
    before = _tree(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in c.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err + out
    assert code == 2, f"exit {code}: {err}{out}"
    assert len(lines) == 1, err
    assert lines[0].startswith("simctl: error: ")
    for s in c.culprit:
        assert s in lines[0], f"{s!r} not named in {lines[0]!r}"
    assert _tree(tmp_path) == before, "the command left files behind"
