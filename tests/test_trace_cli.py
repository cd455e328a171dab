"""``simctl trace import|synth|inspect|stats`` end to end through ``sim.cli.main``: outputs, and
every user error as exit 2 with one stderr line, no traceback and no half-written file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moesim.sim.cli.main import main
from moesim.traces.format.trace_file import read_meta, read_trace
from tests.util import assert_same_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"
SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
FLAME_CSV = ROOT.parent / "shared" / "data" / "flame-moe-290m" / "routing.csv"
TINY = ["--model", "tiny", "--num-layers", "2", "--num-experts", "4", "--top-k", "2"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("simctl: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_import_csv_jsonl_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("csv", "jsonl"):
        out = tmp_path / f"{fmt}.parquet"
        code, text, _ = run(capsys, "trace", "import", "--from", fmt, str(DATA / f"tiny.{fmt}"), "-o", str(out), *TINY)
        assert code == 0 and "8 rows" in text
        assert read_trace(out).num_rows == 8
    arr = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[3, 2], [1, 0]]], dtype=np.int16)
    np.save(tmp_path / "cap.npy", arr)
    out = tmp_path / "v.parquet"
    code, _, err = run(capsys, "trace", "import", "--from", "vllm", str(tmp_path / "cap.npy"), "-o", str(out),
                       *TINY, "--request-lengths", "2:1")
    assert code == 0, err
    assert read_trace(out).phase.tolist() == [0, 0, 0, 0, 1, 1]


@pytest.mark.skipif(not FLAME_CSV.exists(), reason="needs ../shared/data/flame-moe-290m")
def test_import_flame_reproduces_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "flame.parquet"
    code, text, _ = run(capsys, "trace", "import", "--from", "flame", str(FLAME_CSV), "-o", str(out))
    assert code == 0 and "16,384 rows" in text
    assert_same_trace(read_trace(out), read_trace(SAMPLE))


@pytest.mark.parametrize(("args", "words"), [
    (["--from", "parquet", "x.csv"], ["--from 'parquet': unknown format"]),
    (["--from", "csv", "{tiny}"], ["--model is required"]),
    (["--from", "csv", "{tiny}", "--model", "mixtral"], ["unknown model 'mixtral'", "did you mean"]),
    (["--from", "csv", "{missing}", *TINY], ["no such file"]),
    (["--from", "csv", "{bad}", *TINY], ["bad.csv, line 3, field 'experts'", "outside 0..3"]),
    (["--from", "csv", "{tiny}", *TINY, "--sidecar", "x.json"], ["--sidecar applies to --from vllm only"]),
    (["--from", "vllm", "{npy}", *TINY], ["no request boundaries"]),
    (["--from", "vllm", "{npy}", *TINY, "--request-lengths", "a:b"], ["--request-lengths"]),
])
def test_import_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: list[str]) -> None:
    (tmp_path / "bad.csv").write_text("request_id,token_idx,layer,experts\n0,0,0,1 2\n0,0,1,1 7\n")
    np.save(tmp_path / "cap.npy", np.zeros((1, 2, 2), dtype=np.int16))
    subst = {"{tiny}": str(DATA / "tiny.csv"), "{missing}": str(tmp_path / "nope.csv"),
             "{bad}": str(tmp_path / "bad.csv"), "{npy}": str(tmp_path / "cap.npy")}
    out = tmp_path / "out.parquet"
    code, _, err = run(capsys, "trace", "import", *[subst.get(a, a) for a in args], "-o", str(out))
    assert_one_line_error(code, err, *words)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "cap.npy"]  # no temp files left


def test_output_path_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "adir").mkdir()
    code, _, err = run(capsys, "trace", "import", "--from", "csv", str(DATA / "tiny.csv"), "-o",
                       str(tmp_path / "adir"), *TINY)
    assert_one_line_error(code, err, "adir", "is a folder")
    (tmp_path / "afile").write_text("x")
    code, _, err = run(capsys, "trace", "synth", "--preset", "olmoe-1b-7b", "--requests", "1", "-o",
                       str(tmp_path / "afile" / "t.parquet"))
    assert_one_line_error(code, err, "afile", "is a file, not a folder")


def test_synth_inspect_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    args = ["--preset", "qwen1.5-moe-a2.7b", "--requests", "2", "--prompt-len", "8", "--decode-len", "8",
            "--set", "num_layers=4", "--set", "token_locality=0.9", "--seed", "3"]
    for out in (a, b):
        code, text, err = run(capsys, "trace", "synth", *args, "-o", str(out))
        assert code == 0, err
        assert "128 rows" in text and "rows/s" in text
    assert a.read_bytes() == b.read_bytes()
    meta = read_meta(a)
    assert meta.source["params"]["token_locality"] == 0.9 and meta.source["params"]["seed"] == 3
    assert meta.model.num_layers == 4 and meta.model.num_experts == 60

    code, text, _ = run(capsys, "trace", "inspect", str(a))
    assert code == 0 and "valid" in text and "prefill" in text and "first 5 rows" in text
    code, text, _ = run(capsys, "trace", "inspect", str(a), "--json", "--rows", "2")
    info = json.loads(text)
    assert code == 0 and info["tokens_by_phase"] == {"prefill": 16, "decode": 16} and len(info["head"]) == 2
    assert info["embedding"] == {"rows": 32, "dim": 16}

    code, text, _ = run(capsys, "trace", "stats", str(a))
    assert code == 0 and "next-layer" in text and "LRU@15" in text and "all" in text
    code, text, _ = run(capsys, "trace", "stats", str(a), "--json", "--cache-sizes", "4,8")
    d = json.loads(text)
    assert code == 0 and d["cache_sizes"] == [4, 8] and len(d["layers"]) == 4
    assert 0 <= d["overall"]["next_layer_acc"] <= 1 and set(d["overall"]["lru"]) == {"4", "8"}

    code, text, _ = run(capsys, "trace", "synth-params")
    assert code == 0 and "token_locality" in text and "olmoe-1b-7b" in text


@pytest.mark.parametrize(("args", "words"), [
    (["--set", "bogus=1"], ["synthetic.bogus: unknown parameter"]),
    (["--set", "token_locality=2"], ["synthetic.token_locality"]),
    (["--set", "novalue"], ["expected KEY=VALUE"]),
    (["--preset", "gpt-5"], ["unknown preset 'gpt-5'"]),
    (["--requests", "0"], ["synthetic.requests"]),
])
def test_synth_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: list[str]) -> None:
    out = tmp_path / "s.parquet"
    code, _, err = run(capsys, "trace", "synth", *args, "-o", str(out))
    assert_one_line_error(code, err, *words)
    assert not out.exists()


def test_stats_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "trace", "stats", str(SAMPLE), "--cache-sizes", "4,x")
    assert_one_line_error(code, err, "--cache-sizes")
    code, _, err = run(capsys, "trace", "stats", str(SAMPLE), "--cache-sizes", "0")
    assert_one_line_error(code, err, "must be >= 1")


def test_flame_stats_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "trace", "stats", str(SAMPLE))
    assert code == 0
    overall = next(line for line in text.splitlines() if "│   all" in line)
    assert "10.5%" in overall  # token-to-token reuse of the top-6


def test_console_script_error_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    proc = subprocess.run([sys.executable, "-m", "moesim.sim.cli.main", "trace", "inspect", str(bad)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a Parquet file" in proc.stderr and "Traceback" not in proc.stderr
