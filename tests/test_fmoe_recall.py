"""fMoE's prompt matched token by token (a hand-made prefill), the fMoE set's runtime, and
benchmarks/fmoe_recall.py's map-structure figures on a hand-made case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from moesim.policies.contract.base import Profile
from moesim.policies.fmoe.map_prefetch import ExpertMapPrefetcher
from moesim.policies.fmoe.policy import FMoE
from moesim.traces.analysis.recall import Routing
from moesim.traces.format.trace_file import (
    DECODE,
    PREFILL,
    ModelInfo,
    TraceMeta,
    trace_from_columns,
)
from tests.util import run_engine, tiny_hw, tiny_model

ROOT = Path(__file__).resolve().parents[1]

# two tokens' router probabilities over 3 layers x 4 experts (top-1): A routes e0, e1, e2, B e1, e3, e0
A = np.array([[.7, .1, .1, .1], [.1, .7, .1, .1], [.1, .1, .7, .1]])
B = np.array([[.1, .7, .1, .1], [.1, .1, .1, .7], [.7, .1, .1, .1]])


def test_a_prompt_is_matched_and_stored_token_by_token() -> None:
    """A profile prompt of two tokens, A then B, is stored as two maps; a new 2-token prompt
    routed as A and B is matched token by token (the authors' code, IntelliSys-Lab/FineMoE-EuroSys26,
    matches every row of a prefill): after layer 0, token 0's trajectory finds A's map and token
    1's B's, so layer 1 gets e1 and e3 and layer 2 e2 and e0 (d = 1, K = 1): 4 hits. Layer 0 is
    the semantic match (the prompt's embedding equals the stored one: score 1, delta 0, one
    expert of the first stored map: e0): 1 hit, and e1 a miss. The prompt's mean map, the reading
    before, holds (.1, .4, .1, .4) at layer 1 and prefetched one of e1 and e3. After the
    iteration the store holds 4 maps, the new tokens' last."""
    L, J = 3, 4
    cols = {"request_id": np.zeros(2 * L, dtype=np.int32), "token_idx": np.repeat([0, 1], L).astype(np.int32),
            "phase": np.full(2 * L, PREFILL, dtype=np.int8), "layer": np.tile(np.arange(L), 2).astype(np.int16),
            "experts": np.array([[0], [1], [2], [1], [3], [0]], dtype=np.int16),
            "weights": np.full((2 * L, 1), .7, dtype=np.float32),
            "logits": np.log(np.concatenate([A, B])).astype(np.float16),
            "embedding": np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float16), "embedding_rows": np.array([0, L])}
    tr = trace_from_columns(cols, TraceMeta(ModelInfo("tiny", L, J, 1)))
    profile = Profile(experts=np.array([[[0], [1], [2]], [[1], [3], [0]]]), weights=None,
                      logits=np.log(np.stack([A, B])), lookahead_logits=None,
                      request_id=np.array([10, 10]), phase=np.array([PREFILL, PREFILL]),
                      iteration=np.array([0, 0]), embedding=np.array([[1.0, 0.0]]), source="test")
    pol = FMoE(prefetch_distance=1, store_capacity=4, match_us=0.0)
    _, m = run_engine(tr, pol, tiny_model(L, J, 1), tiny_hw(layer_us=5000), budget_experts=8,
                      profile=profile, phases=("prefill", "decode"))
    assert (m["hits"], m["misses"]) == (5, 1)
    pf = pol.prefetcher
    assert isinstance(pf, ExpertMapPrefetcher) and pf.store.n == 4
    for slot, emap in enumerate([A, B, A, B]):
        np.testing.assert_allclose(pf.store.maps[slot], emap, atol=2e-3)


def test_fmoe_measurement_set_runs_every_system_on_the_moe_infinity_codebase_runtime() -> None:
    """fMoE section 5 ('We prototype fMoE on top of Huggingface Transformers framework using
    MoE-Infinity codebase') and section 6.2 ('All baselines and fMoE are implemented on top of the
    MoE-Infinity codebase'): every system of measurements/fmoe-end-to-end.yaml runs the runtime
    that the moe-infinity-readme fit measured for that codebase, read from the committed fit by
    path (a refit there moves these rows), and no row or reference sets another runtime."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.study.fit_spec import load_measurements

    fit = ROOT / "benchmarks" / "results" / "fits" / "moe-infinity-readme" / "fitted.yaml"
    path = ROOT / "measurements" / "fmoe-end-to-end.yaml"
    base = yaml.safe_load(path.read_text())["base"]
    assert (path.parent / base["runtime"]).resolve() == fit.resolve()
    layer_us = yaml.safe_load(fit.read_text())["runtime"]["layer_us"]
    ms = load_measurements(path)
    for row in ms.rows:
        for data, ref in row.variants:
            for scen in (data, ref):
                assert scen is not None
                spec = load_scenario_data(scen, source="row", base_dir=path.parent).runtime_spec()
                assert spec.layer_us == layer_us


def _routing(paths: dict[int, list[int]], requests: list[list[int]]) -> Routing:
    """Decode tokens of the given ids, request by request; token id ``w`` routes to
    ``paths[w][l]`` at layer ``l`` (top-1 of 4 experts, probability 0.7 there, 0.1 elsewhere)."""
    ids = [w for req in requests for w in req]
    L = len(next(iter(paths.values())))
    experts = np.array([[[paths[w][lay]] for lay in range(L)] for w in ids])
    probs = np.full((len(ids), L, 4), 0.1)
    np.put_along_axis(probs, experts, 0.7, axis=2)
    return Routing(experts=experts, request=np.repeat(np.arange(len(requests)), [len(r) for r in requests]),
                   phase=np.full(len(ids), DECODE), probs=probs, lookahead=None, token_id=np.array(ids),
                   embedding=None, has_embedding=None, num_experts=4)


def test_map_structure_finds_the_map_of_the_same_token_and_nothing_for_a_new_one() -> None:
    """Profile: requests [A, B] and [B]; evaluated: [A, C]. A's trajectory matches A's stored map
    (recall 1 at every target layer 1..3, d = 1); C's id was never stored and no stored map
    shares an expert with it (recall 0), so half the tokens are seen, the trajectory recall is
    0.5, the same-id map gives 1 on the seen token, and the best stored map 0.5 overall."""
    from benchmarks.fmoe_recall import map_structure

    a, b, c = 7, 8, 9
    r = _routing({a: [0, 1, 2, 3], b: [1, 2, 3, 0], c: [2, 3, 0, 1]}, [[a, b], [b], [a, c]])
    f = map_structure(r, profile_requests=2, d=1)
    assert (f["store"], f["tokens"], f["chance"]) == (3, 2, 0.25)
    assert f["seen_share"] == 0.5
    assert (f["trajectory_seen"], f["trajectory_unseen"], f["trajectory"]) == (1.0, 0.0, 0.5)
    assert f["same_id_map"] == 1.0
    assert f["best"] == 0.5
    assert f["previous_token"] == 0.0   # C after A in the evaluated request: no expert in common
    assert "semantic" not in f and "lookahead" not in f
