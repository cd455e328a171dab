"""Trace statistics: LRU stack distances against a plain LRU cache, every per-layer statistic on
a hand-made trace, batch-size independence, and the FLAME sample's known reuse."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.traces.analysis.stats import (
    LruStackDistances,
    default_cache_sizes,
    lru_hit_rates,
    lru_stack_distances,
    trace_stats,
    trace_summary,
)
from moesim.traces.format.trace_file import ModelInfo, TraceMeta, write_trace
from tests.util import ROOT

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "samples" / "flame-moe-290m.parquet"


def lru_reference(stream: list[int], size: int) -> float:
    """Hit rate of a plain LRU cache of ``size`` items (first references miss)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for x in stream:
        if x in cache:
            hits += 1
            cache.move_to_end(x)
        else:
            cache[x] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits / len(stream)


def lru_reference_tokens(tokens: list[list[int]], size: int) -> float:
    """Hit rate of an LRU cache of ``size`` items looking up each token's experts together:
    hits against the cache before the token, then all of them most recent (the run's rule)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = refs = 0
    for tok in tokens:
        hits += sum(x in cache for x in tok)
        refs += len(tok)
        for x in tok:
            cache[x] = None
            cache.move_to_end(x)
        while len(cache) > size:
            cache.popitem(last=False)
    return hits / refs


def test_stack_distances_by_hand() -> None:
    s = [0, 1, 0, 2, 1, 0, 0]
    assert lru_stack_distances(s).tolist() == [-1, -1, 1, -1, 2, 2, 0]
    np.testing.assert_allclose(lru_hit_rates(s, [1, 2, 3, 10]), [1 / 7, 2 / 7, 4 / 7, 4 / 7])
    np.testing.assert_allclose(lru_hit_rates(np.array([[0, 1], [1, 0]]), [1, 2]), [0.25, 0.5])
    assert math.isnan(LruStackDistances(3).hit_rates([1])[0])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(stream=st.lists(st.integers(0, 9), min_size=1, max_size=300), chunk=st.integers(1, 80),
       pieces=st.integers(1, 4))
def test_lru_matches_a_plain_lru_cache(stream: list[int], chunk: int, pieces: int) -> None:
    sizes = list(range(0, 12))
    want = [lru_reference(stream, c) if c else 0.0 for c in sizes]
    np.testing.assert_allclose(lru_hit_rates(stream, sizes), want)
    # fed in pieces, with tiny internal chunks: the same distances
    acc = LruStackDistances(10, chunk_cells=chunk * 10)
    acc._chunk = chunk  # force sub-chunks smaller than the default floor
    parts = np.array_split(np.asarray(stream), pieces)
    got = np.concatenate([acc.update(p) for p in parts])
    np.testing.assert_array_equal(got, lru_stack_distances(stream, 10))
    np.testing.assert_allclose(acc.hit_rates(sizes), want)


def test_default_cache_sizes() -> None:
    assert default_cache_sizes(64, 6) == [6, 16, 32, 48]
    assert default_cache_sizes(8, 2) == [2, 4, 6]
    assert default_cache_sizes(2, 1) == [1, 2]


# --------------------------------------------------------------------------------------------
# A hand-made trace: 1 layer is not enough for next-layer accuracy, so L = 2, E = 4, k = 2.

MODEL = ModelInfo(name="hand", num_layers=2, num_experts=4, top_k=2)
# experts[token][layer]; tokens 0-2 are request 0, tokens 3-4 request 1
EXPERTS = [
    [[0, 1], [2, 3]],
    [[0, 2], [2, 3]],
    [[1, 3], [0, 3]],
    [[0, 1], [1, 2]],
    [[0, 1], [1, 3]],
]
REQ = [0, 0, 0, 1, 1]
TOK = [0, 1, 2, 0, 1]


def _lookahead_for(top: list[list[int]]) -> np.ndarray:
    """Logits rows whose top-2 are the given pairs."""
    out = np.zeros((len(top), 4), dtype=np.float16)
    for i, (a, b) in enumerate(top):
        out[i, a], out[i, b] = 2.0, 1.0
    return out


# lookahead at layer 0 predicts layer 1 of the same token; at layer 1, layer 0 of the next token
LOOK = [
    [[2, 3], [0, 2]],   # layer1 [2,3]: 2/2; next token layer0 [0,2]: 2/2
    [[2, 0], [3, 1]],   # [2,3]: 1/2;     next [1,3]: 2/2
    [[0, 1], [0, 1]],   # [0,3]: 1/2;     no next token in request 0
    [[1, 2], [3, 2]],   # [1,2]: 2/2;     next [0,1]: 0/2
    [[0, 1], [0, 1]],   # [1,3]: 1/2;     end
]


def _hand_trace(tmp_path: Path, *, lookahead: bool = True) -> Path:
    ex = np.asarray(EXPERTS, dtype=np.int16)
    cols: dict[str, Any] = {
        "request_id": np.repeat(REQ, 2).astype(np.int32), "token_idx": np.repeat(TOK, 2).astype(np.int32),
        "phase": np.ones(10, dtype=np.int8), "layer": np.tile([0, 1], 5).astype(np.int16),
        "experts": ex.reshape(10, 2),
    }
    if lookahead:
        cols["lookahead_logits"] = _lookahead_for([p for tok in LOOK for p in tok])
    return write_trace(tmp_path / "hand.parquet", cols, TraceMeta(model=MODEL))


def _entropy(counts: list[int]) -> float:
    p = np.asarray(counts, dtype=float) / sum(counts)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / math.log(4))


def test_stats_by_hand(tmp_path: Path) -> None:
    st_ = trace_stats(_hand_trace(tmp_path), cache_sizes=[1, 2, 4])
    assert (st_.tokens, st_.requests, st_.rows, st_.tokens_by_phase) == (5, 2, 10, {"prefill": 0, "decode": 5})
    l0, l1 = st_.layers
    # popularity: layer 0 counts 0:4, 1:4, 2:1, 3:1; layer 1 counts 0:1, 1:2, 2:3, 3:4
    assert l0.entropy == pytest.approx(_entropy([4, 4, 1, 1]))
    assert l1.entropy == pytest.approx(_entropy([1, 2, 3, 4]))
    assert l0.top10_share == pytest.approx(4 / 10) and l1.top10_share == pytest.approx(4 / 10)
    # reuse pairs (t-1, t): (0,1), (1,2), (3,4); layer 0 overlaps 1, 0, 2; layer 1: 2, 1, 1
    assert l0.reuse == pytest.approx(3 / 6) and l1.reuse == pytest.approx(4 / 6)
    assert st_.overall.reuse == pytest.approx(7 / 12)
    # next layer: layer 0 overlaps 2, 1, 1, 2, 1 over 5 tokens; layer 1 (next token) 2, 2, 0 over 3
    assert l0.next_layer_acc == pytest.approx(7 / 10) and l1.next_layer_acc == pytest.approx(4 / 6)
    assert st_.overall.next_layer_acc == pytest.approx(11 / 16)
    # co-activation, layer 0: pairs (0,1) x3, (0,2), (1,3); 90% of 5 needs 3 pairs of 6
    assert l0.coact_sparsity == pytest.approx(1 - 3 / 6) and l0.coact_zero == pytest.approx(3 / 6)
    # LRU on layer 0's tokens (0 1) (0 2) (1 3) (0 1) (0 1), each token's experts together:
    # at C = 2, token (1 3) after (0 2) misses both, where a reference-by-reference LRU would
    # have let 1 push out 0 first; by hand: hits 0, 1 (0), 0, 1 (1), 2 -> 4 of 10
    tokens0 = [tok[0] for tok in EXPERTS]
    assert l0.lru[2] == pytest.approx(4 / 10)
    for c in (1, 2, 4):
        assert l0.lru[c] == pytest.approx(lru_reference_tokens(tokens0, c))
    tokens1 = [tok[1] for tok in EXPERTS]
    assert st_.overall.lru[2] == pytest.approx((lru_reference_tokens(tokens0, 2) + lru_reference_tokens(tokens1, 2)) / 2)
    d = st_.to_dict()
    assert d["layers"][0]["lru"]["2"] == l0.lru[2] and d["chance_reuse"] == 0.5


def test_stats_independent_of_batch_size(tmp_path: Path) -> None:
    path = _hand_trace(tmp_path)
    ref = trace_stats(path).to_dict()
    for rows in (1, 3, 7):
        assert trace_stats(path, batch_rows=rows).to_dict() == ref


def test_stats_without_lookahead(tmp_path: Path) -> None:
    st_ = trace_stats(_hand_trace(tmp_path, lookahead=False))
    assert all(x.next_layer_acc is None for x in st_.layers) and st_.overall.next_layer_acc is None
    assert st_.to_dict()["overall"]["next_layer_acc"] is None


def test_flame_sample_character() -> None:
    st_ = trace_stats(SAMPLE)
    assert st_.overall.reuse == pytest.approx(0.105, abs=0.002)  # NOTICE: about 10.5%
    assert st_.chance_reuse == pytest.approx(6 / 64)
    assert st_.overall.entropy > 0.98  # FLAME is trained with load balancing
    assert st_.overall.next_layer_acc is None
    assert st_.cache_sizes == [6, 16, 32, 48]
    rates = [st_.overall.lru[c] for c in st_.cache_sizes]
    assert rates == sorted(rates) and 0 < rates[0] < rates[-1] < 1


def test_summary(tmp_path: Path) -> None:
    info = trace_summary(SAMPLE, head=3)
    assert info["rows"] == 16_384 and info["tokens"] == 2048 and info["requests"] == 32
    assert info["tokens_by_phase"] == {"prefill": 0, "decode": 2048}
    assert info["tokens_per_request"] == {"min": 64, "mean": 64.0, "max": 64}
    assert info["head"][0] == {"request_id": 0, "token_idx": 0, "phase": "decode", "layer": 0,
                               "experts": [34, 28, 21, 47, 3, 12],
                               "weights": [0.0998, 0.05228, 0.04171, 0.03843, 0.03256, 0.02956],
                               "token_id": 1512}
    assert len(info["head"]) == 3 and info["embedding"] is None


def test_stats_lru_is_the_hit_rate_of_an_lru_run(capsys: pytest.CaptureFixture[str]) -> None:
    """One definition (docs/contract.md, "Hit rate"): `trace stats` LRU@C equals `simctl run`
    with policy lru and C experts per layer, on the bundled sample (batch 1, all requests)."""
    from moesim.sim.cli.main import main

    sample = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
    st_ = trace_stats(sample, cache_sizes=[6, 16])
    for c in (6, 16):
        assert main(["run", str(ROOT / "scenarios" / "flame-lru.yaml"), "--json",
                     "--set", f"cache.experts_per_layer={c}"]) == 0
        run = json.loads(capsys.readouterr().out)
        assert run["hit_rate"] == pytest.approx(st_.overall.lru[c], abs=1e-12), c
