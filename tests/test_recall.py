"""Prediction recall (traces/analysis/recall.py): every measure on a hand-made trace against
hand-computed figures, the map matching against fMoE's own ExpertMapStore, the profile split
and phase choice, errors, and ``simctl trace stats`` printing it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moesim.policies.fmoe.expert_maps import ExpertMapStore
from moesim.sim.cli.main import main
from moesim.traces.analysis.recall import (
    RecallError,
    _semantic_best,
    _trajectory_best,
    default_profile_requests,
    recall_stats,
    routing_arrays,
    trace_recall,
)
from moesim.traces.format.trace_file import ModelInfo, TraceMeta, write_trace

MODEL = ModelInfo(name="hand", num_layers=3, num_experts=4, top_k=1)
# (request, phase, experts per layer, token id, embedding); a 1-token prompt is one prefill iteration
TOKENS = [
    (0, 0, [0, 1, 2], 5, (1.0, 0.0)),
    (0, 1, [1, 2, 3], 6, (0.0, 1.0)),
    (1, 0, [2, 2, 2], 7, (1.0, 1.0)),
    (1, 1, [0, 1, 3], 5, (1.0, 0.1)),
    (2, 0, [3, 3, 3], 8, (0.0, 1.0)),
    (2, 1, [0, 1, 2], 5, (0.9, 0.1)),   # evaluated token E1
    (2, 1, [0, 2, 0], 6, (0.1, 1.0)),   # evaluated token E2
]
# lookahead of E1 and E2: layer 0 guesses 1 and 2, layer 1 guesses 3 and 0
LOOK_BEST = {(5, 0): 1, (5, 1): 3, (6, 0): 2, (6, 1): 0}


def hand_columns() -> dict[str, np.ndarray]:
    L, E = MODEL.num_layers, MODEL.num_experts
    req, pos, phase, layer, ex, tok, look = [], [], [], [], [], [], []
    counters: dict[int, int] = {}
    for i, (r, ph, experts, tid, _) in enumerate(TOKENS):
        p = counters.get(r, 0)
        counters[r] = p + 1
        for lay in range(L):
            req.append(r)
            pos.append(p)
            phase.append(ph)
            layer.append(lay)
            ex.append([experts[lay]])
            tok.append(tid)
            row = np.zeros(E)
            if (i, lay) in LOOK_BEST:
                row[LOOK_BEST[(i, lay)]] = 5.0
            look.append(row)
    return {
        "request_id": np.array(req, dtype=np.int32), "token_idx": np.array(pos, dtype=np.int32),
        "phase": np.array(phase, dtype=np.int8), "layer": np.array(layer, dtype=np.int16),
        "experts": np.array(ex, dtype=np.int16), "weights": np.ones((len(req), 1), dtype=np.float32),
        "lookahead_logits": np.array(look, dtype=np.float16), "token_id": np.array(tok, dtype=np.int32),
        "embedding": np.array([t[4] for t in TOKENS], dtype=np.float16),
        "embedding_rows": np.arange(len(TOKENS), dtype=np.int64) * L,
    }


# Worked by hand (module docstring of tests/test_recall.py's TOKENS): per target layer, k = 1.
EXPECTED = {
    "lookahead": [None, 1.0, 0.5],          # E1: 1 hit, 3 miss; E2: 2 hit, 0 hit
    "transition@1": [None, 0.5, 0.5],       # 0 -> 1 (x2); 1 -> 2 and 2 -> 2 (ties to the lower id)
    "transition@2": [None, None, 0.5],      # 0 -> {2, 3}: 2
    "transition@3": [None, None, None],
    "previous_token": [0.5, 0.0, 0.0],      # E1 after [3, 3, 3]; E2 after E1
    "same_token": [0.5, 1.0, 0.0],          # E1 after request 1's id 5, E2 after request 0's id 6
    "popularity": [1.0, 0.5, 0.5],          # profile's most routed: 0; 1 (tie 1/2); 2 (tie 2/3)
    "semantic": [0.5, 1.0, 0.0],            # E1 -> (1, 0.1) = [0, 1, 3]; E2 -> (0, 1) = [1, 2, 3]
    "trajectory@1": [None, 0.5, 0.5],       # first of equal one-hot prefixes: [0, 1, 2] both times
    "trajectory@2": [None, None, 0.5],
    "trajectory@3": [None, None, None],
}


def test_every_measure_by_hand(tmp_path: Path) -> None:
    cols = hand_columns()
    rec = recall_stats(routing_arrays(cols, MODEL), profile_requests=2)
    assert (rec.profile_requests, rec.eval_requests, rec.eval_tokens, rec.store_maps) == (2, 1, 2, 4)
    assert rec.chance == 0.25
    for name, want in EXPECTED.items():
        assert rec.layers[name] == pytest.approx(want), name
    assert rec.overall["lookahead"] == pytest.approx(0.75)
    assert rec.overall["same_token"] == pytest.approx(0.5)
    assert rec.overall["popularity"] == pytest.approx(4 / 6)
    assert rec.overall["previous_token"] == pytest.approx(1 / 6)
    assert rec.overall["trajectory@3"] is None and rec.missing["trajectory@3"] == "needs more than 3 layer(s)"
    # the same through a file
    path = tmp_path / "hand.parquet"
    write_trace(path, cols, TraceMeta(model=MODEL))
    assert trace_recall(path, profile_requests=2).layers == rec.layers
    # the default split profiles floor(70%) of 3 requests: 2
    assert default_profile_requests(3) == 2 and default_profile_requests(1) == 0
    assert default_profile_requests(10) == 7 and default_profile_requests(2) == 1


def test_phases_and_missing_columns() -> None:
    cols = hand_columns()
    both = recall_stats(routing_arrays(cols, MODEL), profile_requests=2, phases=("prefill", "decode"))
    assert both.eval_tokens == 3
    # the prefill token [3, 3, 3] (no previous token, id 8 never seen) adds only guesses that miss
    assert both.layers["popularity"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert both.layers["same_token"] == EXPECTED["same_token"]
    bare = {k: v for k, v in cols.items() if k not in ("lookahead_logits", "token_id", "embedding", "embedding_rows")}
    rec = recall_stats(routing_arrays(bare, MODEL), profile_requests=2)
    assert rec.missing["lookahead"] == "the trace has no lookahead_logits"
    assert rec.missing["same_token"] == "the trace has no token_id"
    assert rec.missing["semantic"] == "the trace has no embedding"
    assert rec.layers["trajectory@1"] == EXPECTED["trajectory@1"]
    none = recall_stats(routing_arrays(cols, MODEL), profile_requests=0)
    assert none.overall["popularity"] is None and "no profile split" in none.missing["popularity"]
    with pytest.raises(RecallError, match="--profile-requests 3: the trace has 3 request"):
        recall_stats(routing_arrays(cols, MODEL), profile_requests=3)


def test_matching_mirrors_fmoe_expert_map_store() -> None:
    rng = np.random.default_rng(3)
    S, Q, L, E, h = 40, 25, 5, 8, 6
    maps = rng.dirichlet(np.ones(E), size=(S, L))
    sems = rng.standard_normal((S, h))
    store = ExpertMapStore(S, L, E, distance=1)
    for s in range(S):
        store.insert(sems[s], maps[s])
    queries = rng.dirichlet(np.ones(E), size=(Q, L))
    qsem = rng.standard_normal((Q, h))
    best = _trajectory_best(store.maps[:S].astype(np.float64), queries)
    sem = _semantic_best(store.sem[:S].astype(np.float64), qsem)
    for q in range(Q):
        assert sem[q] == store.semantic(qsem[q])[0]
        dots, sq = np.zeros(S), 0.0
        for lay in range(L):
            dots += store.layer_dots(lay, queries[q, lay])
            sq += float(queries[q, lay] @ queries[q, lay])
            assert best[q, lay] == store.trajectory(lay, dots, sq)[0]


def test_stats_cli_prints_recall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hand.parquet"
    write_trace(path, hand_columns(), TraceMeta(model=MODEL))
    assert main(["trace", "stats", str(path), "--profile-requests", "2"]) == 0
    out = capsys.readouterr()[0]
    assert "prediction recall" in out and "traj@1" in out and "same-token" in out
    assert "trans@3: not measured (needs more than 3 layer(s))" in out
    assert main(["trace", "stats", str(path), "--json", "--profile-requests", "2"]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert doc["recall"]["layers"]["semantic"] == EXPECTED["semantic"]
    assert main(["trace", "stats", str(path), "--phase", "both"]) == 2
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and "--phase 'both'" in err
    assert main(["trace", "stats", str(path), "--profile-requests", "5"]) == 2
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and "--profile-requests 5" in err
