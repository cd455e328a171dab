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
