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
