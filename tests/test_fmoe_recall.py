"""The fMoE set's runtime and benchmarks/fmoe_recall.py's map-structure figures on a hand-made case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from moesim.traces.analysis.recall import Routing
from moesim.traces.format.trace_file import DECODE

ROOT = Path(__file__).resolve().parents[1]


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
