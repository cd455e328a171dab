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
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path / "c"), "--format", "csv"]) == 0
    assert (tmp_path / "c" / "curve.csv").stat().st_size > 0 and (tmp_path / "c" / "curve.png").exists()
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path / "p")]) == 0
    t = pq.read_table(tmp_path / "p" / "curve.parquet").to_pydict()
    rows = [(p, lay, s, h) for p, lay, s, h in zip(t["policy"], t["layer"], t["size"], t["hits"], strict=True)]
    full = [h for p, lay, s, h in rows if lay == -1 and s == 64]
    assert len(full) == 2 and full[0] == full[1]   # every expert fits: both only miss first references
    assert main(["curve", str(SAMPLE), "--phases", "warmup"]) == 2
    assert "--phases: 'warmup'" in capsys.readouterr().err
    assert main(["curve", str(tmp_path / "none.parquet")]) == 2


def test_curve_of_any_policy_is_the_simulator_at_each_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fifo's curve at 8 experts per layer is a plain run of that scenario; per-layer hits sum
    to all layers; sizes come as experts, % of a layer and GiB."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.runner import run_loaded

    assert main(["curve", str(SAMPLE), "--policy", "fifo,lru", "--sizes", "8,64", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fifo hit rate" in out and "one-pass sequential curves" in " ".join(out.split())
    t = pq.read_table(tmp_path / "curve.parquet").to_pandas()
    assert sorted(set(t["size"])) == [8, 64] and set(t["policy"]) == {"fifo", "lru"}
    assert set(t[t["policy"] == "fifo"]["method"]) == {"simulated"} and set(t[t["policy"] == "lru"]["method"]) == {"stack"}
    fifo = t[t["policy"] == "fifo"]
    for _size, g in fifo.groupby("size"):
        assert g[g["layer"] == -1]["hits"].item() == g[g["layer"] >= 0]["hits"].sum()
        assert g[g["layer"] == -1]["references"].item() == g[g["layer"] >= 0]["references"].sum()
    loaded = load_scenario_data({"trace": str(SAMPLE), "hardware": "rtx-4090", "policy": "fifo",
                                 "cache": {"experts_per_layer": 8, "initial": "empty"},
                                 "workload": {"batch_size": 1, "phases": ["decode"], "requests": "all"}},
                                source="t", base_dir=ROOT)
    m = run_loaded(loaded).metrics
    row = fifo[(fifo["size"] == 8) & (fifo["layer"] == -1)].iloc[0]
    assert (row["hits"], row["references"]) == (m["hits"], m["accesses"])
    assert row["hit_rate"] == pytest.approx(m["hit_rate"])
    assert row["cache_pct"] == 12.5
    full = t[(t["size"] == 64) & (t["layer"] == -1)]
    assert full["cache_gib"].iloc[0] == pytest.approx(m["expert_budget_gib"] * 8, rel=1e-9)
    assert full["hits"].nunique() == 1      # every expert fits: only first references miss, either way
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("args", "needle"), [
    (["--policy", "lfuu"], "--policy: 'lfuu' is not a registered policy; did you mean 'lfu'?"),
    (["--sizes", "0,4"], "--sizes: 0 is not between 1 and the 64 experts of a layer"),
    (["--sizes", "four"], "--sizes: expected whole numbers"),
    (["--policy", "moepic", "--sizes", "8"], "lookahead_logits"),
])
def test_curve_bad_policy_or_sizes_is_one_line(args: list[str], needle: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curve", str(SAMPLE), "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
