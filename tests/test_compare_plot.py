"""`simctl compare` (ranks, bound labels, CSV, figure) and `simctl plot` (sweep figures and the
timeline of one run, PNG and PDF; bad input is one line and exit 2)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
import yaml

from moesim.sim.cli.main import main
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished small sweep: three policies (one a bound) x two cache rates x two seeds."""
    tmp = tmp_path_factory.mktemp("sweep")
    spec = {"name": "plots", "base": str(QUICKSTART), "set": {"workload.requests": 1, "cache.initial": "random"},
            "grid": {"policy": ["no-cache", "lru", "belady"], "cache.rate": [0.25, 0.5], "seed": [0, 1]}}
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(tmp / "sweep.yaml"), "--out", str(tmp / "out"), "-j", "1", "--no-progress"]) == 0
    return tmp / "out"


def _is_figure(path: Path) -> bool:
    head = path.read_bytes()[:8]
    return path.stat().st_size > 1000 and (head.startswith(b"%PDF") or head.startswith(b"\x89PNG"))


def test_compare_ranks_policies_and_labels_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    code, md, err = run_cli(["compare", str(QUICKSTART), "--policies", "lru,belady,no-cache,lfu",
                             "--rates", "0.25,0.5", "--set", "workload.requests=1", "--out", str(out), "-j", "1",
                             "--no-progress"], capsys)
    assert code == 0, err
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| 0.")]
    assert len(rows) == 8
    for rate in ("0.25", "0.5"):
        block = [r for r in rows if r[0] == rate]
        assert [r[1] for r in block] == ["1", "2", "3", "bound"]
        assert block[-1][2] == "belady (bound)"
        tpots = [float(r[3]) for r in block[:3]]
        assert tpots == sorted(tpots)  # ranked by TPOT, lowest first
        no_cache = next(r for r in block if r[2] == "no-cache")
        assert no_cache[-2] == "1.00"  # the default baseline of the speed-up column (before notes)
    assert "### Bounds: oracle policies" in md and "### Lossy" not in md
    csv = pd.read_csv(io.StringIO((out / "compare.csv").read_text()))
    assert list(csv["kind"]).count("oracle") == 2 and csv["rank"].isna().sum() == 2
    assert (out / "compare.md").read_text() == md
    assert _is_figure(out / "compare.png") and _is_figure(out / "compare.pdf")
    # again: every point is already done; CSV on stdout, ranked on hit rate
    code, text, err = run_cli(["compare", str(QUICKSTART), "-p", "lru,belady,no-cache,lfu", "-r", "0.25,0.5",
                               "--set", "workload.requests=1", "--out", str(out), "-f", "csv", "-m", "hit-rate",
                               "--no-figure"], capsys)
    assert code == 0 and text.startswith("cache.rate,kind,rank,tied,policy,bound,status,seeds") and "8 points" not in text
    again = pd.read_csv(io.StringIO(text))
    ranked = again[again["rank"].notna() & (again["cache.rate"] == 0.25)]
    assert list(ranked["hit_rate"]) == sorted(ranked["hit_rate"], reverse=True)


def test_compare_takes_every_registered_policy_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moesim.policies.contract.registry import policy_class, policy_names
    from moesim.sim.study.compare import comparison_sweep

    sw = comparison_sweep(QUICKSTART, sets=["workload.requests=1"])
    assert [p.policy for p in sw.points] == policy_names()
    assert [p.bound for p in sw.points] == [bool(policy_class(n).oracle) for n in policy_names()]
    code, _, err = run_cli(["compare", str(QUICKSTART), "-p", "lru,lruu", "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "unknown policy 'lruu'; did you mean 'lru'?" in err and err.count("\n") == 1
    code, _, err = run_cli(["compare", str(QUICKSTART), "-m", "speed", "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "--metric" in err


def test_plot_writes_every_sweep_figure_as_png_and_pdf(sweep_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["plot", str(sweep_dir)], capsys)
    assert code == 0, err
    written = [Path(p) for p in out.split()]
    stems = {"tpot", "throughput", "hit_rate", "bytes", "speedup"}
    assert {p.name for p in written} == {f"{s}.{f}" for s in stems for f in ("png", "pdf")}
    assert all(p.parent == sweep_dir / "figures" and _is_figure(p) for p in written)
    code, out, err = run_cli(["plot", str(sweep_dir / "results.parquet"), "--kind", "speedup", "--baseline", "lru",
                              "--x", "cache.rate", "--facet", "seed", "-f", "pdf", "--out", str(tmp_path / "f")], capsys)
    assert code == 0, err
    f = tmp_path / "f"
    # a PNG always comes with the vector format asked, so that the two are the same drawing
    assert out.split() == [str(f / "speedup.png"), str(f / "speedup.pdf")] and _is_figure(f / "speedup.pdf")


def test_plot_leaves_no_older_figure_beside_a_new_one(sweep_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 35: `plot --policies ... -f pdf` after a plot of every policy left the older PNG
    (every policy) beside the new PDF (two). A plot writes its folder whole (``--force``
    replaces the earlier one through the one replace path), so no figure of the earlier plot
    is left beside the new one: the PDF asked for, and the PNG (at least 1,280 px wide) that
    every figure comes with."""
    import matplotlib.image as mpimg

    f = tmp_path / "f"
    assert run_cli(["plot", str(sweep_dir), "--kind", "tpot", "-f", "svg", "--out", str(f)], capsys)[0] == 0
    assert {p.name for p in f.iterdir()} >= {"tpot.png", "tpot.svg"}
    code, out, err = run_cli(["plot", str(sweep_dir), "--kind", "tpot", "--policies", "lru,belady", "-f", "pdf",
                              "--out", str(f), "--force"], capsys)
    assert code == 0, err
    assert sorted(Path(p).name for p in out.split()) == ["tpot.pdf", "tpot.png"]
    assert sorted(p.name for p in f.iterdir() if not p.name.startswith(".")) == ["tpot.pdf", "tpot.png"]
    assert mpimg.imread(f / "tpot.png").shape[1] >= 1280


def test_sweep_figure_labels_units_bounds_and_averages_seeds(sweep_dir: Path) -> None:
    import matplotlib.pyplot as plt

    from moesim.sim.study.plot import load_table, sweep_figure

    df, params = load_table(sweep_dir)
    assert params == ["policy", "cache.rate", "seed"]
    fig = sweep_figure(df, params, "tpot")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "expert cache (fraction of routed-expert bytes)" and ax.get_ylabel() == "TPOT, mean (ms)"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["no-cache", "lru", "belady (bound)"]
    assert not ax.get_legend()  # the legend sits outside the axes
    series = {c.get_label(): c.lines[0] for c in ax.containers}  # one errorbar container per line
    assert series["belady (bound)"].get_linestyle() == ":" and series["lru"].get_linestyle() == "-"
    ok = df[(df["policy"] == "lru") & (df["cache.rate"] == 0.25)]
    assert series["lru"].get_ydata()[0] == pytest.approx(ok["tpot_ms_mean"].mean())  # mean over the two seeds
    plt.close(fig)


def test_plot_timeline_of_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    code, _, err = run_cli(["run", str(QUICKSTART), "--set", "workload.requests=1", "--set", "policy=oracle-prefetch",
                            "--out", str(run), "--timeline", "--no-progress"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["plot", str(run), "--start", "2", "--iterations", "2"], capsys)
    assert code == 0, err
    assert out.split() == [str(run / "timeline.png"), str(run / "timeline.pdf")]
    assert _is_figure(run / "timeline.png") and _is_figure(run / "timeline.pdf")
    (run / "timeline.json").unlink()  # the steps alone still give the per-iteration view
    code, out, err = run_cli(["plot", str(run), "-f", "png", "--out", str(tmp_path / "f")], capsys)
    assert code == 0 and _is_figure(tmp_path / "f" / "timeline.png"), err
    code, _, err = run_cli(["plot", str(run), "--start", "9999"], capsys)
    assert code == 2 and "--start 9999: the run has iterations 0..63" in err


@pytest.mark.parametrize(("args", "needle"), [
    (["nowhere"], "nowhere: no such file or folder"),
    (["{tmp}"], "no sweep table (results.parquet) here"),
    (["{sweep}", "--kind", "tpt"], "tpt: choose from tpot"),
    (["{sweep}", "--x", "cache.rat"], "--x cache.rat: no such column"),
    (["{sweep}", "--kind", "speedup", "--baseline", "lruu"], "--baseline lruu: not in the table's policy column"),
])
def test_plot_bad_input_is_one_line(args: list[str], needle: str, sweep_dir: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tmp=tmp_path, sweep=sweep_dir) for a in args]
    code, _, err = run_cli(["plot", *argv, "--out", str(tmp_path / "f")], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
