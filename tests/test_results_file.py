"""The benchmark scripts' report command line (``benchmarks/results_file.py``): ``--out`` writes
the printed Markdown, and never replaces a file that moesim did not write."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.results_file import report_main
from moesim.sim.core.errors import MoesimError


def test_report_main_prints_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.md"
    assert report_main(lambda: "# report\n", "a report", ["--out", str(out)]) == 0
    assert out.read_text() == "# report\n"
    assert capsys.readouterr().out == "# report\n\n"


def test_report_main_prints_only_without_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main(lambda: "text", "a report", []) == 0
    assert capsys.readouterr().out == "text\n"
    assert list(tmp_path.iterdir()) == []


def test_report_main_never_replaces_a_users_file(tmp_path: Path) -> None:
    mine = tmp_path / "notes.md"
    mine.write_text("my own notes\n")
    with pytest.raises(MoesimError, match="notes.md"):
        report_main(lambda: "# report\n", "a report", ["--out", str(mine)])
    assert mine.read_text() == "my own notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.md"]   # no temporary left behind


def _writes_an_option_path_directly(source: str) -> list[int]:
    """Lines where a script calls ``write_text``/``write_bytes`` on a path built from its command
    line (``args.out``, ``Path(args.json)``...), bypassing :func:`write_result`."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"write_text", "write_bytes"}
                and any(isinstance(n, ast.Name) and n.id == "args" for n in ast.walk(node.func.value))):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_direct_write() -> None:
    assert _writes_an_option_path_directly("args.out.write_text(x)\nPath(args.json).write_bytes(b)\n") == [1, 2]
    assert _writes_an_option_path_directly("write_result(args.out, x)\ntmp.write_text(x)\n") == []


def test_no_benchmark_script_writes_its_output_option_directly() -> None:
    here = Path(__file__).resolve().parent.parent / "benchmarks"
    found = {p.name: lines for p in sorted(here.glob("*.py"))
             if (lines := _writes_an_option_path_directly(p.read_text()))}
    assert found == {}, f"write these through results_file.write_result: {found}"
