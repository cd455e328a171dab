"""Text from files and users, escaped for each place it goes (:mod:`moesim.sim.core.escape`):
hostile strings (raw HTML, Markdown links and table pipes, terminal escapes, newlines, bidi
overrides, rich markup, spreadsheet formulas) through every sink: ``report.md`` and
``compare.md`` (rendered by a CommonMark renderer that allows raw HTML), ``report.html``,
``compare.csv`` and ``simctl table``, ``trace inspect``, the ``run`` summary, ``simctl
policies`` and error lines."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from rich.console import Console
from rich.text import Text

from moesim.sim.cli.main import main
from moesim.sim.core.escape import csv_cell, md_code, md_text, terminal, visible
from tests.bad_input import SAMPLE, base_scenario, small_table, write_trace
from tests.util import ROOT

HOSTILE = ("<script>alert(1)</script><img src=x onerror=alert(2)> a|b \x1b[31mRED\x1b[0m\r\nforged: ok "
           "[red]markup[/red] \u202eexe.txt [l](javascript:alert(3)) ![i](http://t/x.png) *em* _u_ `c` ~~s~~ "
           "&lt;b&gt; \\| \x07\x9b\u2028")
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")
RENDER = MarkdownIt("commonmark", {"html": True}).enable("table")


def cells(md: str) -> list[list[str]]:
    """The inner HTML of every table cell of ``md`` rendered, row by row."""
    out = RENDER.render(md)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S) for row in re.findall(r"<tr>(.*?)</tr>", out, re.S)]


# --- the functions ----------------------------------------------------------------------------
def test_visible_shows_every_control_character_and_keeps_the_rest() -> None:
    out = visible(HOSTILE)
    assert not CONTROL.search(out)
    assert "\\x1b[31mRED" in out and "\\r\\nforged" in out and "\\u202eexe" in out and "\\x07\\x9b\\u2028" in out
    assert visible("café 中文 naïve") == "café 中文 naïve"


def test_terminal_text_is_neither_markup_nor_escapes() -> None:
    assert Text.from_markup(terminal(HOSTILE)).plain == visible(HOSTILE)
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=400).print(terminal(HOSTILE), highlight=False)
    printed = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())   # the console's own styling only
    assert "[red]" in printed and "\x1b" not in printed and "\r" not in printed and printed.count("\n") == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_md_text_is_one_plain_table_cell(text: str) -> None:
    """Any text in a table cell: the row keeps its two cells, the cell holds no tag, and it
    reads as the visible text."""
    rows = cells(f"| k | v |\n| --- | --- |\n| a | {md_text(text)} |\n")
    assert len(rows) == 2 and len(rows[1]) == 2, rows
    inner = rows[1][1]
    assert "<" not in inner, inner
    assert html.unescape(inner).strip() == visible(text).strip()


def test_md_text_of_the_hostile_string() -> None:
    out = RENDER.render(f"Every run warns: {md_text(HOSTILE)}.\n")
    assert "<script" not in out and "<img" not in out and "<a " not in out and "<em>" not in out
    assert "<code>" not in out and "<s>" not in out


def test_md_code_cannot_be_closed_from_inside() -> None:
    for text in ("a```b", "``x``", "`", "simctl sweep s.yaml\n```\n<script>x</script>"):
        out = RENDER.render(md_code(text, block=True) + "\n\nafter\n")
        assert out.count("<pre>") == 1 and "<script" not in out and out.rstrip().endswith("<p>after</p>")
        span = RENDER.render("in " + md_code(text) + " here\n")
        assert span.count("<code>") == 1 and "<script" not in span


@pytest.mark.parametrize(("cell", "out"), [
    ("=HYPERLINK(\"http://e\",\"x\")", "'=HYPERLINK(\"http://e\",\"x\")"), ("+1+cmd", "'+1+cmd"), ("@SUM(A1)", "'@SUM(A1)"),
    ("-2+3", "'-2+3"), ("\t=1", "'\t=1"), ("-0.5", "-0.5"), ("+3", "+3"), ("-", "-"), ("lru", "lru"), (-1.5, -1.5),
])
def test_csv_cell_guards_formulas_only(cell: Any, out: Any) -> None:
    assert csv_cell(cell) == out


# --- the sinks --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished comparison whose table and study.json carry the hostile string in the study
    name, a policy name, warnings, errors and the trace's name and path, with its report."""
    out = tmp_path_factory.mktemp("hostile") / "cmp"
    assert main(["compare", str(ROOT / "scenarios" / "quickstart.yaml"), "-p", "lru,fifo,moepic", "--rates", "0.5",
                 "--set", "workload.requests=1", "--out", str(out), "-j", "1", "--no-progress", "--no-figure"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    df.loc[df["policy"] == "fifo", "policy"] = HOSTILE
    df["warnings"] = json.dumps(["=cmd|' /C calc'!A0", HOSTILE])
    df["trace_name"] = HOSTILE
    df.loc[df["status"] != "ok", "error"] = HOSTILE
    df.to_parquet(out / "results.parquet")
    study = json.loads((out / "study.json").read_text())
    study["name"] = HOSTILE
    for c in study.get("commands", []):
        c["cwd"] = HOSTILE + "```"
        c["command"] = "simctl compare x\n```\n" + HOSTILE
    (out / "study.json").write_text(json.dumps(study))
    shutil.rmtree(out / "figures", ignore_errors=True)
    assert main(["report", str(out)]) == 0
    return out


def assert_plain_markdown(md: str) -> None:
    rendered = RENDER.render(md)
    for bad in ("<script", "<img src=x", "<a ", "onerror=alert(2)>", "\x1b", "\u202e"):
        assert bad not in rendered, bad
    assert "&lt;script&gt;" in rendered
    widths = {len(r) for table in re.findall(r"<table>(.*?)</table>", rendered, re.S)
              for r in [re.findall(r"<t[dh][^>]*>", row) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]}
    tables = re.findall(r"<table>(.*?)</table>", rendered, re.S)
    for table in tables:   # every row of a table as wide as its header: no cell was split or lost
        rows = [len(re.findall(r"<t[dh][^>]*>", row)) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
        assert len(set(rows)) == 1, rows
    assert widths


def test_report_md_is_plain_text(hostile_study: Path) -> None:
    md = (hostile_study / "report.md").read_text()
    assert "\x1b" not in md and "\u202e" not in md   # (raw HTML only inside code, which renders it as text)
    assert_plain_markdown(md)
    page = (hostile_study / "report.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page   # the HTML page escapes as before


def test_compare_md_and_csv(hostile_study: Path) -> None:
    from moesim.sim.study.compare import rank
    from moesim.sim.study.compare_table import to_csv, to_markdown
    from moesim.sim.study.plot import load_table

    df, _ = load_table(hostile_study)
    comp = rank(df, metric="tpot")
    assert_plain_markdown(to_markdown(comp))
    rows = pd.read_csv(io.StringIO(to_csv(comp)), keep_default_na=False)
    warned = [w for w in rows["warnings"] if w]
    assert warned and all(w.startswith("'=cmd|' /C calc'!A0 | <script>") for w in warned)


def test_simctl_table_csv_guards_formulas(hostile_study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    df = pd.read_parquet(hostile_study / "results.parquet")
    df["error"] = "=HYPERLINK(\"http://e\")"
    df.to_parquet(hostile_study / "results.parquet")
    assert main(["table", str(hostile_study), "-c", "policy,error"]) == 0
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out), keep_default_na=False)
    assert set(rows["error"]) == {"'=HYPERLINK(\"http://e\")"}


def hostile_trace(path: Path) -> None:
    meta = json.loads(pytest.importorskip("pyarrow.parquet").read_schema(SAMPLE).metadata[b"moe_trace"])
    meta["model"]["name"] = HOSTILE
    meta["source"] = {"by": HOSTILE}
    write_trace(path, small_table(), meta)


def test_trace_inspect_shows_file_text_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile_trace(tmp_path / "t.parquet")
    assert main(["trace", "inspect", str(tmp_path / "t.parquet"), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "\\x1b[31mRED" in out and "[red]markup[/red]" in out and "\\r\\nforged" in out
    assert not any(line.startswith("forged") for line in out.splitlines())


def test_run_summary_shows_file_text_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile_trace(tmp_path / "t.parquet")
    data = base_scenario()
    data.update(trace="t.parquet", name="scen[bold]x\x1b[2J")
    data["workload"]["requests"] = 1
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    code = main(["run", str(tmp_path / "s.yaml"), "--no-baselines"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in out + err and "\u202e" not in out
    assert "scen[bold]x\\x1b[2J" in out


def test_policies_show_a_plugins_text_escaped(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from moesim.policies.baselines.caching import LRU
    from moesim.sim.cli import policy_info

    class Evil(LRU):
        summary = HOSTILE

    monkeypatch.setattr(policy_info, "policy_names", lambda: ["lru"])
    monkeypatch.setattr(policy_info, "policy_class", lambda name: Evil)
    monkeypatch.setattr(policy_info, "make_policy", lambda name, params: Evil())
    buf = io.StringIO()
    console = Console(file=buf, width=300)
    console.print(policy_info.policy_table())
    console.print(policy_info.describe_policy("lru"))
    out = buf.getvalue()
    assert "\x1b" not in out and "\u202e" not in out and "[red]markup[/red]" in out and "\\x1b[31mRED" in out


def test_error_lines_show_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = str(tmp_path / "evil\x1b[2K\rsimctl: all good\u202e.yaml")
    assert main(["run", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err and "\\x1b[2K\\rsimctl: all good" in err
