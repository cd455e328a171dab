"""Replicated seeds: the 95% interval of a mean, ties in a ranking, and `simctl compare
--seeds N` folding its seeds into one row per policy with its interval and tie marks."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moesim.sim.cli.main import main
from moesim.sim.study.replicates import ci95, merge_seeds, tie_ranks
from tests.util import ROOT

FLAME = ROOT / "scenarios" / "flame-lru.yaml"


def test_ci95_is_students_t_half_width() -> None:
    """Three samples 1, 2, 3: sd 1, t(0.975, 2) = 4.3027, half-width 4.3027 / sqrt(3) = 2.4841;
    one sample has no interval."""
    assert ci95(np.array([1.0, 0.0]), np.array([3, 1])) == pytest.approx([2.48414, 0.0], abs=1e-5)


def test_ties_within_one_percent_are_measured_from_the_first_of_a_run() -> None:
    # 100 and 100.5 tie (0.5%); 100.9 ties with 100 too; 101.5 is 1.5% from 100: a new rank,
    # though 0.6% from 100.9 (no chaining); 110 stands alone
    assert tie_ranks([100, 100.5, 100.9, 101.5, 110]) == [(1, True), (1, True), (1, True), (4, False), (5, False)]
    assert tie_ranks([1.0, 2.0, 3.0]) == [(1, False), (2, False), (3, False)]


def test_ties_within_overlapping_intervals() -> None:
    # 10 +- 1 and 11.5 +- 1 overlap (1.5 <= 2); 13 +- 0.1 is 3 from 10: alone
    assert tie_ranks([10.0, 11.5, 13.0], [1.0, 1.0, 0.1]) == [(1, True), (1, True), (3, False)]


def test_merge_seeds_averages_finished_seeds_and_keeps_na_rows() -> None:
    df = pd.DataFrame({"policy": ["a", "a", "a", "b", "b", "c"], "seed": [0, 1, 2, 0, 1, 0],
                       "cache.rate": [0.25] * 6, "status": ["ok", "ok", "ok", "ok", "ok", "n/a"],
                       "tpot_ms_mean": [1.0, 2.0, 3.0, 5.0, 5.0, np.nan], "error": [None] * 5 + ["why"]})
    out = merge_seeds(df, ["cache.rate"]).set_index("policy")
    assert "seed" not in out.columns
    assert out.loc["a", "tpot_ms_mean"] == 2.0 and out.loc["a", "tpot_ms_mean_ci95"] == pytest.approx(2.48414, abs=1e-5)
    assert (out.loc["a", "seeds"], out.loc["b", "seeds"], out.loc["c", "seeds"]) == (3, 2, 0)
    assert out.loc["b", "tpot_ms_mean_ci95"] == 0.0 and out.loc["c", "error"] == "why"


def test_compare_with_seeds_gives_intervals_and_tie_marks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """random's hit rate varies with the seed, lru's does not: three seeds give one row per
    policy, the mean with its interval, and the tie mark where intervals overlap."""
    out = tmp_path / "c"
    assert main(["compare", str(FLAME), "-p", "lru,random", "--seeds", "3", "--set", "workload.requests=1",
                 "--out", str(out), "-j", "1", "--no-progress", "-m", "hit-rate", "-f", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert sorted(csv["policy"]) == ["lru", "random"] and set(csv["seeds"]) == {3}
    raw = pd.read_parquet(out / "results.parquet")
    for name, row in csv.set_index("policy").iterrows():
        rates = raw[raw["policy"] == name]["hit_rate"]
        assert row["hit_rate"] == pytest.approx(rates.mean())
        assert row["hit_rate_ci95"] == pytest.approx(ci95(np.array([rates.std()]), np.array([3]))[0])
    assert csv.set_index("policy").loc["random", "hit_rate_ci95"] > 0
    md = (out / "compare.md").read_text()
    assert "± 95% (3 seeds)" in md and "means of 3 seeds" in md
    ranks = list(csv.sort_values("rank")["tied"])
    expected = tie_ranks(list(csv.sort_values("rank")["hit_rate"]), list(csv.sort_values("rank")["hit_rate_ci95"]))
    assert ranks == [t for _, t in expected]
    # the report folds the seeds too: the seed is never an axis or a panel, the provenance names them
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| seed | 0, 1, 2 (3 seeds: means with 95% intervals) |" in report
    assert re.findall(r"!\[[^]]*\]\(([^)]+)\)", report) == ["report-figures/ranked.png"]
    capsys.readouterr()
    assert main(["compare", str(FLAME), "--seeds", "0", "--out", str(tmp_path / "z")]) == 2
    assert "--seeds: 0" in capsys.readouterr().err


def test_a_comparison_figure_draws_the_seeds_interval() -> None:
    """compare folds its seeds before drawing: the line figure still shows their interval."""
    from moesim.sim.study.compare import comparison_figure, rank

    rows = [{"policy": p, "cache.rate": r, "seed": s, "status": "ok", "bound": False, "kind": "lossless",
             "tpot_ms_mean": 1.0 + r + (0.1 * s if p == "random" else 0.0), "hit_rate": 0.5 + r}
            for p in ("lru", "random") for r in (0.25, 0.5) for s in (0, 1, 2)]
    comp = rank(pd.DataFrame(rows), metric="tpot")
    fig = comparison_figure(comp)
    bars = {c.get_label(): c for c in fig.axes[0].containers}
    def spans(name: str) -> list[float]:
        return [float(s[1][1] - s[0][1]) for s in bars[name].lines[2][0].get_segments()]

    assert spans("random") == pytest.approx([2 * ci95(np.array([0.1]), np.array([3]))[0]] * 2)
    assert spans("lru") == [0.0, 0.0]      # deterministic: the same TPOT whatever the seed


def test_sweep_seeds_adds_a_seed_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    spec = {"name": "sw", "base": str(FLAME), "set": {"workload.requests": 1},
            "grid": {"policy": ["lru", "random"], "cache.rate": [0.125, 0.25]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--seeds", "3", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "12 points, 0 done" in out and "seed=2" in out
    spec["grid"]["seed"] = [0, 1]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "s.yaml"), "--seeds", "3", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sweeps seed already" in err
