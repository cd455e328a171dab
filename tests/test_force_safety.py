"""Issue 31: ``--force`` replaces only what moesim wrote, and the bad inputs and outputs around
it are one line each. Every test runs in ``tmp_path`` with HOME and the working folder moved
there: nothing here can reach the real home folder or ``/``."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.sim.core.atomic import TMP_TAG, OutputError, check_target, replace_folder
from moesim.sim.core.folder_lock import FolderLock
from moesim.sim.core.ownership import MARKER, owned_file, read_marker
from tests.bad_input import scen

ROOT = Path(__file__).resolve().parents[1]
TINY_CSV = ROOT / "tests/data/traces/tiny.csv"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sandboxed home folder with a working folder inside it (``home/proj``), made current."""
    h = tmp_path / "home"
    (h / "proj").mkdir(parents=True)
    (h / ".bashrc").write_text("mine")
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.chdir(h / "proj")
    (h / "proj" / "s.yaml").write_text(scen())
    return h


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str, *needles: str) -> str:
    """Assert a one-line error (exit 2, no traceback) naming each needle; return the line."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def sweep_file(folder: Path, rates: list[float], name: str = "sw") -> Path:
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "base": "s.yaml", "grid": {"cache.rate": rates}}))
    return p


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TMP_TAG in p.name)


# --- folders moesim never touches --------------------------------------------------------------
@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("target", ["~", "/", ".", "..", "~/proj"])
@pytest.mark.parametrize("command", [["run", "s.yaml"], ["sweep", "sw.yaml", "--no-progress"],
                                     ["compare", "s.yaml", "-p", "lru", "--rates", "0.5", "--no-figure"],
                                     ["fit", "no-such-measurements.yaml"]])
def test_root_home_and_working_folders_are_refused_without_offering_force(
        command: list[str], target: str, force: list[str], home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_file(home / "proj", [0.5])
    out = str(Path(target).expanduser())
    before = sorted(p.name for p in home.iterdir())
    code, _, err = cli(capsys, *command, "--out", out, *force)
    line = one_line(code, err, "moesim never writes into it")
    assert "--force" not in line
    assert sorted(p.name for p in home.iterdir()) == before and (home / ".bashrc").read_text() == "mine"


def test_a_user_folder_is_never_replaced(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = home / "proj" / "thesis"
    user.mkdir()
    (user / "thesis.tex").write_text("chapter 1")
    for extra in ([], ["--force"]):
        code, _, err = cli(capsys, "run", "s.yaml", "--out", user, *extra)
        line = one_line(code, err, "moesim did not write")
        assert "--force" not in line
    assert [p.name for p in user.iterdir()] == ["thesis.tex"] and not leftovers(user.parent)


def test_force_replaces_a_marked_output_and_an_empty_folder(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = home / "proj" / "o"
    out.mkdir()                                     # empty: taken without --force
    assert cli(capsys, "run", "s.yaml", "--out", out)[0] == 0
    assert read_marker(out) == {"kind": "run", "written_by": "moesim"}
    code, _, err = cli(capsys, "run", "s.yaml", "--out", out)
    one_line(code, err, "add --force")
    code, _, err = cli(capsys, "run", "s.yaml", "--out", out, "--force")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.yaml", "metrics.json", "steps.parquet"]
    assert not leftovers(out.parent)


def test_an_unmarked_output_from_before_says_how_to_proceed(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = home / "proj" / "old"
    assert cli(capsys, "run", "s.yaml", "--out", old)[0] == 0
    (old / MARKER).unlink()                          # as moesim wrote it before the marker existed
    code, _, err = cli(capsys, "run", "s.yaml", "--out", old, "--force")
    line = one_line(code, err, "from before", "move it away or delete it yourself")
    assert "--force" not in line and (old / "metrics.json").exists()


def test_the_replace_path_checks_again_just_before_it_replaces(tmp_path: Path) -> None:
    out, new = tmp_path / "o", tmp_path / "new"
    out.mkdir()
    new.mkdir()
    (out / "notes.txt").write_text("written after the check")
    with pytest.raises(OutputError, match="moesim never replaces it"):
        replace_folder(out, new, option="--out")
    assert (out / "notes.txt").exists()


@pytest.mark.parametrize("command", [["run", "s.yaml"], ["sweep", "sw.yaml", "--no-progress"]])
def test_a_symbolic_link_is_refused_and_nothing_is_left(command: list[str], home: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5])
    assert cli(capsys, "run", "s.yaml", "--out", proj / "real")[0] == 0
    (proj / "link").symlink_to(proj / "real")
    code, _, err = cli(capsys, *command, "--out", proj / "link", "--force")
    one_line(code, err, "symbolic link")
    assert (proj / "link").is_symlink() and (proj / "real" / "metrics.json").exists() and not leftovers(proj)


def test_an_output_name_that_is_not_utf8_is_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "run", "s.yaml", "--out", "bad\udcffname")
    one_line(code, err, "not UTF-8", "bad\\xffname")
    assert sorted(p.name for p in (home / "proj").iterdir()) == ["s.yaml"]


# --- files --------------------------------------------------------------------------------------
def test_force_replaces_a_trace_moesim_wrote_but_no_other_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    synth = ["trace", "synth", "--requests", "1", "--prompt-len", "0", "--decode-len", "2", "-o"]
    mine = home / "proj" / "mine.parquet"
    mine.write_text("not a trace")
    code, _, err = cli(capsys, *synth, mine, "--force")
    assert "--force" not in one_line(code, err, "moesim did not write")
    assert mine.read_text() == "not a trace"
    t = home / "proj" / "t.parquet"
    assert cli(capsys, *synth, t)[0] == 0
    one_line(*cli(capsys, *synth, t)[::2], "add --force")
    assert cli(capsys, *synth, t, "--force")[0] == 0


def test_files_moesim_wrote_are_recognised_by_their_content(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("# moesim calibration profile (simctl calibrate)\nhardware: {}\n")
    (tmp_path / "u.yaml").write_text("hardware: {}\n")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "plain.parquet")
    assert owned_file(tmp_path / "p.yaml") and not owned_file(tmp_path / "u.yaml")
    assert not owned_file(tmp_path / "plain.parquet")
    with pytest.raises(OutputError, match="moesim did not write"):
        check_target(tmp_path / "u.yaml", option="--out", folder=False, force=True)
    check_target(tmp_path / "p.yaml", option="--out", folder=False, force=True)


def test_table_out_replaces_only_its_own_table(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5])
    assert cli(capsys, "sweep", "sw.yaml", "--out", "st", "--no-progress")[0] == 0
    notes = proj / "notes.csv"
    notes.write_text("name,grade\nme,A\n")
    code, _, err = cli(capsys, "table", "st", "--out", notes, "--force")
    assert "--force" not in one_line(code, err, "moesim did not write")
    assert notes.read_text() == "name,grade\nme,A\n"
    assert cli(capsys, "table", "st", "--out", proj / "t.csv")[0] == 0
    one_line(*cli(capsys, "table", "st", "--out", proj / "t.csv")[::2], "add --force")
    assert cli(capsys, "table", "st", "--out", proj / "t.csv", "--force", "-c", "policy,tpot_ms_mean")[0] == 0
    assert (proj / "t.csv").read_text().splitlines()[0] == "policy,tpot_ms_mean"


def test_model_prompts_replace_only_a_prompts_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["model", "prompts", "--n", "2", "--bytes", "16", "-o"]
    mine = home / "proj" / "p.jsonl"
    mine.write_text('{"prompt": "mine"}\n')
    code, _, err = cli(capsys, *args, mine, "--force")
    one_line(code, err, "moesim did not write")
    mine.unlink()
    assert cli(capsys, *args, mine)[0] == 0
    one_line(*cli(capsys, *args, mine)[::2], "add --force")
    assert cli(capsys, *args, mine, "--force")[0] == 0


# --- studies ------------------------------------------------------------------------------------
def test_a_study_folder_resumes_only_the_same_study(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5], "a")
    sweep_file(proj, [0.25], "b")
    assert cli(capsys, "sweep", "a.yaml", "--out", "o", "--no-progress")[0] == 0
    code, _, err = cli(capsys, "sweep", "a.yaml", "--out", "o", "--no-progress")
    assert code == 0 and "1 already done" in err
    code, _, err = cli(capsys, "sweep", "b.yaml", "--out", "o", "--no-progress")
    one_line(code, err, "holds another study (a)", "--force")
    code, _, err = cli(capsys, "sweep", "b.yaml", "--out", "o", "--no-progress", "--force")
    assert code == 0 and "0 already done" in err
    assert pq.read_table(proj / "o" / "results.parquet").column("cache.rate").to_pylist() == [0.25]
    assert not leftovers(proj)


def test_a_points_folder_without_the_marker_is_not_resumed(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5])
    (proj / "o" / "points").mkdir(parents=True)
    (proj / "o" / "study.json").write_text("{}")
    for extra in ([], ["--force"]):
        code, _, err = cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress", *extra)
        one_line(code, err, "move it away")
    assert sorted(p.name for p in (proj / "o").iterdir()) == ["points", "study.json"]


def test_two_studies_on_one_folder_the_second_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5, 0.25])
    assert cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress")[0] == 0
    lock = FolderLock(proj / "o")                  # as a running study holds it
    try:
        for extra in ([], ["--force"]):
            code, _, err = cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress", *extra)
            one_line(code, err, "another simctl is writing this folder")
    finally:
        lock.release()
    assert cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress")[0] == 0


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_writing_a_point_or_the_table_is_one_line(home: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import moesim.sim.study.sweep_run as sweep_run

    sweep_file(home / "proj", [0.5])
    with monkeypatch.context() as m:
        m.setattr(sweep_run.os, "fsync", _enospc)
        code, _, err = cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress")
        one_line(code, err, "No space left on device", "run the same command again")
    assert not list((home / "proj" / "o" / "points").iterdir())
    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", _enospc)
        code, _, err = cli(capsys, "sweep", "sw.yaml", "--out", "o", "--no-progress")
        one_line(code, err, "No space left on device")
    assert not (home / "proj" / "o" / "results.parquet").exists()


def test_a_full_disk_writing_the_comparison_is_one_line(home: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if "compare.csv" in self.name:
            _enospc()
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full)
    code, out, err = cli(capsys, "compare", "s.yaml", "-p", "lru", "--rates", "0.5", "--out", "c", "--no-figure",
                         "--no-progress")
    one_line(code, err, "compare.csv", "No space left on device")
    assert not (home / "proj" / "c" / "compare.csv").exists() and not leftovers(home / "proj" / "c")


# --- curve and plot ---------------------------------------------------------------------------
CURVE = ["curve", str(ROOT / "traces/samples/tiny-moe.parquet"), "-p", "lru", "--sizes", "1,2", "--out"]


def test_curve_is_written_whole_or_not_at_all(home: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import moesim.sim.study.curve as curve

    with monkeypatch.context() as m:
        m.setattr(curve, "_figure", _enospc)
        code, _, err = cli(capsys, *CURVE, "c")
        one_line(code, err, "No space left on device")
    assert sorted(p.name for p in (home / "proj").iterdir()) == ["s.yaml"]
    assert cli(capsys, *CURVE, "c")[0] == 0
    assert sorted(p.name for p in (home / "proj" / "c").iterdir()) == [MARKER, "curve.parquet", "curve.pdf", "curve.png"]
    one_line(*cli(capsys, *CURVE, "c")[::2], "add --force")
    assert cli(capsys, *CURVE, "c", "--force")[0] == 0
    (home / "proj" / "u").mkdir()
    (home / "proj" / "u" / "x.txt").write_text("mine")
    one_line(*cli(capsys, *CURVE, "u", "--force")[::2], "moesim did not write")


def test_plot_refuses_to_overwrite_without_force(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5, 0.25])
    assert cli(capsys, "sweep", "sw.yaml", "--out", "st", "--no-progress")[0] == 0
    plot = ["plot", "st", "-k", "tpot", "-f", "png"]
    assert cli(capsys, *plot)[0] == 0
    one_line(*cli(capsys, *plot)[::2], "add --force")
    assert cli(capsys, *plot, "--force")[0] == 0
    assert sorted(p.name for p in (proj / "st" / "figures").iterdir()) == [MARKER, "tpot.pdf", "tpot.png"]
    (proj / "mine").mkdir()
    (proj / "mine" / "fig.png").write_text("mine")
    one_line(*cli(capsys, *plot, "--out", "mine", "--force")[::2], "moesim did not write")
    assert cli(capsys, "run", "s.yaml", "--out", "r")[0] == 0
    assert cli(capsys, "plot", "r", "-f", "png")[0] == 0                # the timeline beside the run's files
    one_line(*cli(capsys, "plot", "r", "-f", "png")[::2], "timeline.png", "add --force")
    assert cli(capsys, "plot", "r", "-f", "png", "--force")[0] == 0


def test_report_out_adds_to_no_user_folder(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    sweep_file(proj, [0.5])
    assert cli(capsys, "sweep", "sw.yaml", "--out", "st", "--no-progress")[0] == 0
    (proj / "mine").mkdir()
    (proj / "mine" / "report.md").write_text("my report")
    one_line(*cli(capsys, "report", "st", "--out", "mine")[::2], "moesim did not write")
    assert (proj / "mine" / "report.md").read_text() == "my report"
    assert cli(capsys, "report", "st")[0] == 0 and cli(capsys, "report", "st")[0] == 0   # its own folder


# --- bad input: one line ------------------------------------------------------------------------
def test_yaml_nested_300_deep_is_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = "".join("  " * i + "a:\n" for i in range(300)) + "  " * 300 + "1\n"
    (home / "proj" / "d.yaml").write_text(scen() + "x:\n" + "".join("  " + ln + "\n" for ln in deep.splitlines()))
    one_line(*cli(capsys, "run", "d.yaml")[::2], "d.yaml", "nested too deeply")


def test_trace_metadata_nested_100000_deep_is_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = home / "proj" / "t.parquet"
    pq.write_table(pa.table({"a": [1]}).replace_schema_metadata({b"moe_trace": b"[" * 100_000 + b"]" * 100_000}), t)
    one_line(*cli(capsys, "trace", "inspect", t)[::2], "t.parquet", "nested too deeply")


def test_size_limits_say_how_to_lift_them(home: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    proj = home / "proj"
    monkeypatch.setenv("MOESIM_MAX_YAML_BYTES", "100")
    one_line(*cli(capsys, "run", "s.yaml")[::2], "s.yaml", "over the limit of 100", "MOESIM_MAX_YAML_BYTES=")
    monkeypatch.setenv("MOESIM_MAX_YAML_BYTES", "0")                  # no limit
    assert cli(capsys, "run", "s.yaml")[0] == 0
    sweep_file(proj, [0.125, 0.25, 0.5])
    monkeypatch.setenv("MOESIM_MAX_POINTS", "2")
    one_line(*cli(capsys, "sweep", "sw.yaml", "--no-progress")[::2], "3 points", "MOESIM_MAX_POINTS=3")
    assert not (proj / "runs").exists()
    monkeypatch.setenv("MOESIM_MAX_POINTS", "x")
    one_line(*cli(capsys, "sweep", "sw.yaml", "--no-progress")[::2], "MOESIM_MAX_POINTS='x'")
    long_trace = proj / "long.parquet"
    assert cli(capsys, "trace", "synth", "--requests", "1", "--decode-len", "2", "--prompt-len", "0",
               "-o", long_trace)[0] == 0
    table = pq.read_table(long_trace)
    meta = json.loads(table.schema.metadata[b"moe_trace"])
    meta["source"]["note"] = "m" * 5000                # a downloaded trace's 5,000-character source
    pq.write_table(table.replace_schema_metadata({b"moe_trace": json.dumps(meta).encode()}), long_trace)
    monkeypatch.setenv("MOESIM_MAX_PRINTED", "50")
    code, out, err = cli(capsys, "trace", "inspect", long_trace)
    assert code == 0, err
    assert "m" * 5000 not in out and "MOESIM_MAX_PRINTED=0 prints all" in out


def test_a_csv_quote_left_open_is_reported_where_it_opens(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = TINY_CSV.read_text().splitlines()
    bad = [rows[0], rows[1], rows[2].replace(",", ',"', 1), *rows[3:13]]
    (home / "proj" / "q.csv").write_text("\n".join(bad) + "\n")
    code, _, err = cli(capsys, "trace", "import", "q.csv", "-o", "t.parquet", "--from", "csv", "--model", "tiny",
                       "--num-layers", "2", "--num-experts", "4", "--top-k", "2")
    one_line(code, err, "q.csv, line 3")
    assert not (home / "proj" / "t.parquet").exists()


def test_json_in_a_marker_is_never_run_or_trusted_beyond_its_kind(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("[" * 100_000)
    assert read_marker(tmp_path) == {}                # unreadable: still marked, nothing else believed
    (tmp_path / MARKER).write_text(json.dumps({"kind": "run"}))
    assert read_marker(tmp_path) == {"kind": "run"}


# --- advise -------------------------------------------------------------------------------------
ADVISE = ["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--host-mem", "1", "--reserve", "0",
          "--host-reserve", "0", "--tokens", "8", "--jobs", "1", "--no-progress", "--systems", "lru"]
VRAM = str((543_488 + 20 * 98_304) / 2**30)        # tiny-moe's other weights and 20 experts


def test_advise_out_is_its_own_folder(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = home / "proj"
    (proj / "mine").mkdir()
    (proj / "mine" / "notes.txt").write_text("mine")
    one_line(*cli(capsys, *ADVISE, "--vram", VRAM, "--out", "mine")[::2], "moesim did not write")
    assert cli(capsys, *ADVISE, "--vram", VRAM, "--out", "a")[0] == 0
    assert cli(capsys, *ADVISE, "--vram", VRAM, "--out", "a")[0] == 0            # again: its points reused
    assert read_marker(proj / "a") == {"kind": "advise", "written_by": "moesim"}
    other = str(float(VRAM) * 1.5)
    one_line(*cli(capsys, *ADVISE, "--vram", other, "--out", "a")[::2], "holds another study", "--force")
    assert cli(capsys, *ADVISE, "--vram", other, "--out", "a", "--force")[0] == 0


def test_a_full_disk_writing_the_advice_is_one_line(home: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if "advise.csv" in self.name:
            _enospc()
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full)
    one_line(*cli(capsys, *ADVISE, "--vram", VRAM, "--out", "a")[::2], "advise.csv", "No space left on device")
    assert not (home / "proj" / "a" / "advise.csv").exists() and not leftovers(home / "proj" / "a")
