"""Issue 23, item 7: bad input that used to slip through. A trace's NaN weights stop every run
(not only the runs that read them), an output place the OS refuses is one line, invalid UTF-8
is named at its own line, and a writer killed by SIGTERM leaves no temporary file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from moesim.sim.cli.main import main
from moesim.sim.core.atomic import TMP_TAG
from tests.bad_input import at, mutate, scen

CSV_HEAD = "request_id,token_idx,layer,experts,weights,phase\n"
CSV_ROWS = ["0,0,0,1 2,0.5 0.3,prefill\n", "0,0,1,0 3,0.6 0.2,prefill\n",
            "0,1,0,2 1,0.4 0.35,decode\n", "0,1,1,3 0,0.5 0.25,decode\n"]
SHAPE = ["--model", "my-moe", "--num-layers", "2", "--num-experts", "4", "--top-k", "2"]


def one_line_error(code: int, err: str, *, after_progress: bool = False) -> str:
    """The one error line (``after_progress``: the last line, after transformers' own
    "Loading weights" bar, which is not an error)."""
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    if after_progress:
        lines = [ln for ln in lines if not ln.startswith("Loading weights")]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("simctl: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_nan_weights_stop_a_run_that_does_not_read_them(policy: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    mutate("weights", lambda v: at(v, 12, [float("nan")] * 6))(tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(scen(trace="t.parquet", policy=policy))
    line = one_line_error(main(["run", str(tmp_path / "s.yaml")]), capsys.readouterr().err)
    assert "t.parquet" in line and "row 12" in line and "'weights'" in line and "non-finite" in line


def test_a_refused_write_is_one_line_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS refuses the write after the up-front checks passed (a read-only mount, a folder
    made unwritable meanwhile: tests run as root, so the refusal is simulated)."""
    def refuse(table: object, where: object, **kw: object) -> None:
        Path(str(where)).write_bytes(b"PAR1")    # a partial file, then the refusal
        raise PermissionError(13, f"Failed to open local file '{where}'. Detail: [errno 13] Permission denied")

    monkeypatch.setattr(pq, "write_table", refuse)
    out = tmp_path / "rec" / "x.parquet"
    code = main(["trace", "synth", "--preset", "mixtral-8x7b", "--requests", "1", "--decode-len", "4", "-o", str(out)])
    line = one_line_error(code, capsys.readouterr().err)
    assert str(out) in line and "Permission denied" in line and "Detail" not in line
    assert not out.exists() and not [p for p in out.parent.iterdir() if TMP_TAG in p.name]


def test_record_into_an_unwritable_place_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``simctl trace record -o`` ended in a PermissionError traceback when the write failed."""
    pytest.importorskip("transformers")
    from moesim.traces.tiny.tiny_model import model_dir

    def refuse(table: object, where: object, **kw: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pq, "write_table", refuse)
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n")
    out = tmp_path / "x.parquet"
    code = main(["trace", "record", "--model", str(model_dir()), "--prompts", str(prompts),
                 "--max-new-tokens", "2", "-o", str(out)])
    line = one_line_error(code, capsys.readouterr().err, after_progress=True)
    assert str(out) in line and "Permission denied" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.txt"]
    # a parent that is a regular file is refused before any work
    code = main(["trace", "record", "--model", str(model_dir()), "--prompts", str(prompts),
                 "-o", str(prompts / "x.parquet")])
    assert "is a file, not a folder" in one_line_error(code, capsys.readouterr().err)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_invalid_utf8_is_named_at_its_line(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the bad bytes sit on line 6, after valid lines and before more: a decoder that reads
    # the file in blocks fails on the first block and used to blame line 1
    if fmt == "csv":
        good = [CSV_HEAD.encode()] + [r.encode() for r in CSV_ROWS]
    else:
        good = [b'{"request_id": 0, "token_idx": 0, "layer": 0, "experts": [1, 2]}\n',
                b'{"request_id": 0, "token_idx": 0, "layer": 1, "experts": [0, 3]}\n',
                b'{"request_id": 0, "token_idx": 1, "layer": 0, "experts": [2, 1]}\n',
                b'{"request_id": 0, "token_idx": 1, "layer": 1, "experts": [3, 0]}\n']
    bad = b'0,2,0,1 2,0.5 0.3,decode \xff\xfe\n' if fmt == "csv" else b'{"request_id": 0, "x": "\xff"}\n'
    src = tmp_path / f"r.{fmt}"
    src.write_bytes(b"".join(good) + bad + b"".join(good[1:]))
    code = main(["trace", "import", "--from", fmt, str(src), "-o", str(tmp_path / "o.parquet"), *SHAPE])
    line = one_line_error(code, capsys.readouterr().err)
    assert f"line {len(good) + 1}" in line and "UTF-8" in line, line


def test_invalid_utf8_in_a_response_file_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "v.jsonl"
    src.write_bytes(b'{"prompt_routed_experts": [[[1, 2], [0, 3]]], "choices": []}\n' * 3 + b'{"x": "\xc3"}\n')
    code = main(["trace", "import", "--from", "vllm", str(src), "-o", str(tmp_path / "o.parquet"), *SHAPE])
    assert "line 4" in one_line_error(code, capsys.readouterr().err)


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    import pyarrow.parquet as pq
    real = pq.write_table

    def slow(table, where, **kw):
        real(table.slice(0, 16), where, **kw)   # a partial trace on disk...
        time.sleep(120)                          # ...and the writer is still busy

    pq.write_table = slow
    from moesim.sim.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_synth_killed_mid_write_leaves_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "big.parquet"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, "trace", "synth", "--preset", "mixtral-8x7b",
                             "--requests", "2", "--decode-len", "8", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not [p for p in tmp_path.iterdir() if TMP_TAG in p.name]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the temporary file never appeared"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
