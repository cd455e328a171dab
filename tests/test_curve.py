"""``simctl curve``: LRU and Belady hit counts for every size equal libCacheSim's, simulated
size by size; a hand-worked Belady case; the command's files and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from moesim.sim.cli.main import main
from moesim.traces.analysis.curve import curves, next_use, opt_depths

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"


def test_belady_by_hand() -> None:
    """Stream a b c a b d a, sizes 1..3. MIN with 2 slots: a b miss, c misses and evicts b
    (next use 4, after a's 3), a hits, b misses and evicts c (never again), d misses and evicts
    b, a hits: 2 hits. With 3 slots a and b hit at once, d misses, a hits: 3 hits."""
    s = np.array([0, 1, 2, 0, 1, 3, 0])
    assert next_use(s).tolist() == [3, 4, 7, 6, 7, 7, 7]
    d = opt_depths(s, 4)
    hits = [int(((d >= 0) & (d < c)).sum()) for c in range(1, 5)]
    assert hits == [0, 2, 3, 3]


def _libcachesim_hits(stream: np.ndarray, policy: str, size: int) -> int:
    lcs = pytest.importorskip("libcachesim")
    nxt = next_use(stream)
    never = np.iinfo(np.int64).max
    cache = {"lru": lcs.LRU, "belady": lcs.Belady}[policy](size, hashpower=10)
    hits = 0
    for i, x in enumerate(stream.tolist()):
        req = lcs.Request(obj_size=1, op=lcs.ReqOp.OP_READ, obj_id=x + 1, clock_time=i,
                          next_access_vtime=int(nxt[i]) if nxt[i] < stream.size else never)
        hits += bool(cache.get(req))
    return hits


@pytest.mark.parametrize("experts", [6, 16])
def test_equals_libcachesim_every_size(experts: int) -> None:
    rng = np.random.default_rng(experts)
    streams = [(rng.zipf(1.3, 1500) - 1) % experts for _ in range(2)]
    cur = curves(streams, experts)
    for layer, s in enumerate(streams):
        for size in range(1, experts + 1):
            assert cur.lru[layer, size] == _libcachesim_hits(s, "lru", size), (layer, size)
            assert cur.belady[layer, size] == _libcachesim_hits(s, "belady", size), (layer, size)
    assert (np.diff(cur.belady, axis=1) >= 0).all() and (cur.belady >= cur.lru).all()


def test_curve_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path / "c"), "--format", "csv", "--sizes", "64"]) == 0
    assert (tmp_path / "c" / "curve.csv").stat().st_size > 0 and (tmp_path / "c" / "curve.png").exists()
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path / "p"), "--sizes", "6,64"]) == 0
    t = pq.read_table(tmp_path / "p" / "curve.parquet").to_pydict()
    rows = [(p, lay, s, h) for p, lay, s, h in zip(t["policy"], t["layer"], t["size"], t["hits"], strict=True)]
    full = [h for p, lay, s, h in rows if lay == -1 and s == 64]
    assert len(full) == 2 and full[0] == full[1]   # every expert fits: both only miss first references
    assert main(["curve", str(SAMPLE), "--phases", "warmup"]) == 2
    assert "--phases: 'warmup'" in capsys.readouterr().err
    assert main(["curve", str(tmp_path / "none.parquet")]) == 2


def test_curve_of_any_policy_is_the_simulator_at_each_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fifo's and lru's curves at 8 experts per layer are plain runs of that scenario (lru by
    default on the simulator too, 26.06% at 16 as docs/contract.md says); per-layer hits sum
    to all layers; sizes come as experts, % of a layer and GiB."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.runner import run_loaded

    assert main(["curve", str(SAMPLE), "--policy", "fifo,lru", "--sizes", "8,16,64", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fifo hit rate" in out and "one-pass" not in out
    t = pq.read_table(tmp_path / "curve.parquet").to_pandas()
    assert sorted(set(t["size"])) == [8, 16, 64] and set(t["policy"]) == {"fifo", "lru"}
    assert set(t["method"]) == {"simulated"}
    lru16 = t[(t["policy"] == "lru") & (t["size"] == 16) & (t["layer"] == -1)]
    assert lru16["hit_rate"].item() == pytest.approx(0.2606, abs=5e-5)
    for name in ("fifo", "lru"):
        pol = t[t["policy"] == name]
        for _size, g in pol.groupby("size"):
            assert g[g["layer"] == -1]["hits"].item() == g[g["layer"] >= 0]["hits"].sum()
            assert g[g["layer"] == -1]["references"].item() == g[g["layer"] >= 0]["references"].sum()
        loaded = load_scenario_data({"trace": str(SAMPLE), "hardware": "rtx-4090", "policy": name,
                                     "cache": {"experts_per_layer": 8, "initial": "empty"},
                                     "workload": {"batch_size": 1, "phases": ["decode"], "requests": "all"}},
                                    source="t", base_dir=ROOT)
        m = run_loaded(loaded).metrics
        row = pol[(pol["size"] == 8) & (pol["layer"] == -1)].iloc[0]
        assert (row["hits"], row["references"]) == (m["hits"], m["accesses"])
        assert row["hit_rate"] == pytest.approx(m["hit_rate"])
        assert row["cache_pct"] == 12.5
    full = t[(t["size"] == 64) & (t["layer"] == -1)]
    assert full["cache_gib"].iloc[0] == pytest.approx(m["expert_budget_gib"] * 8, rel=1e-9)
    assert full["hits"].nunique() == 1      # every expert fits: only first references miss, either way
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "curve.pdf").read_bytes()[:4] == b"%PDF"


def test_one_pass_is_labelled_and_lower(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--one-pass gives lru's reference-by-reference curve, labelled so: 22.98% at 16 experts
    (docs/contract.md), below the simulator's 26.06%."""
    assert main(["curve", str(SAMPLE), "--policy", "lru,fifo", "--sizes", "16", "--one-pass",
                 "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0.2298 (one-pass)" in out and "one-pass: lru and belady from stack distances" in out
    t = pq.read_table(tmp_path / "curve.parquet").to_pandas()
    assert set(t[t["policy"] == "lru"]["method"]) == {"one-pass"}
    assert set(t[t["policy"] == "fifo"]["method"]) == {"simulated"}


def _run_hit_rate(trace: Path, policy: str, size: int, applied: dict[str, object]) -> float:
    """``simctl run``'s hit_rate of ``policy`` on a cache of ``size`` experts per layer with
    the settings the curve applied to every policy, through the CLI."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        scen = Path(d) / "s.yaml"
        scen.write_text(json.dumps({"name": "s", "trace": str(trace), "hardware": "rtx-4090", "policy": policy,
                                    "cache": {"experts_per_layer": size, "initial": "empty"},
                                    "workload": {"batch_size": 1, "phases": ["decode"], "requests": "all"},
                                    "seed": 0}))
        sets = [x for k, v in applied.items() for x in ("--set", f"{k}={v}")]
        assert main(["run", str(scen), "--out", str(Path(d) / "r"), *sets]) == 0
        return float(json.loads((Path(d) / "r" / "metrics.json").read_text())["hit_rate"])


def test_curve_equals_run_on_the_same_references(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On tiny-moe, fmoe needs a profile split: every policy of the curve replays the same
    (held-out) requests, so lru, fifo, a prefetcher (mixtral-offloading) and fmoe cover the
    same references, and each point equals simctl run's hit_rate with the split and buffer
    the curve says it applied; moepic cannot run (too few tokens): an n/a row with its
    reason, not an abort."""
    import re

    tiny = ROOT / "traces" / "samples" / "tiny-moe.parquet"
    assert main(["curve", str(tiny), "-p", "lru,fifo,mixtral-offloading,fmoe,moepic", "--sizes", "4,8",
                 "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "n/a: moepic: needs a run of at least" in out
    t = pq.read_table(tmp_path / "curve.parquet").to_pandas()
    allr = t[t["layer"] == -1]
    ran = allr[allr["method"] == "simulated"]
    assert ran["references"].nunique() == 1 and set(ran["policy"]) == {"lru", "fifo", "mixtral-offloading", "fmoe"}
    na = allr[allr["policy"] == "moepic"]
    assert list(na["method"]) == ["n/a", "n/a"] and na["note"].str.contains("routed tokens").all()
    applied = dict(re.findall(r"applied to every policy: ([a-z_.]+)=(\d+)", out))
    assert "profile.requests" in applied
    capsys.readouterr()
    for policy in ("lru", "fifo", "mixtral-offloading"):
        curve = ran[(ran["policy"] == policy) & (ran["size"] == 8)]["hit_rate"].item()
        assert curve == pytest.approx(_run_hit_rate(tiny, policy, 8, applied), abs=1e-12), policy


@pytest.mark.parametrize(("args", "needle"), [
    (["--policy", "lfuu"], "--policy: 'lfuu' is not a registered policy; did you mean 'lfu'?"),
    (["--sizes", "0,4"], "--sizes: 0 is not between 1 and the 64 experts of a layer"),
    (["--sizes", "four"], "--sizes: expected whole numbers"),
])
def test_curve_bad_policy_or_sizes_is_one_line(args: list[str], needle: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_curve_figure_of_many_policies(tmp_path: Path) -> None:
    """Twelve policies and one n/a: a PNG of at least 1,280 px with its PDF beside it (the
    colour-and-grey rule is the sweep figures', tests/test_figures_paper.py)."""
    import matplotlib.image as mpimg

    from moesim.policies.contract.registry import policy_names
    from moesim.sim.study.curve import _figure

    names = [n for n in policy_names() if n != "moepic"][:12]
    pol, lay, size, rate, method = [], [], [], [], []
    for i, n in enumerate([*names, "moepic"]):
        for s in (2, 4, 8):
            pol.append(n)
            lay.append(-1)
            size.append(s)
            rate.append(np.nan if n == "moepic" else 0.1 * s / 8 + 0.01 * i)
            method.append("n/a" if n == "moepic" else "simulated")
    cols = {"policy": np.array(pol), "layer": np.array(lay), "size": np.array(size), "hit_rate": np.array(rate),
            "method": np.array(method), "cache_pct": np.array(size) * 100 / 16.0, "cache_gib": np.array(size) * 0.1}
    png = _figure(cols, tmp_path / "curve.png", "t")
    assert mpimg.imread(png).shape[1] >= 1280 and (tmp_path / "curve.pdf").read_bytes()[:4] == b"%PDF"
