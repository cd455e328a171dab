"""CommitMoE and its "+Prefetch" ablation: the spec sheet's hand-checked timelines (Tests 1-2),
the OWA arithmetic and Eq. (3) (Test 3), the trained predictor (fitted on the profile split
only) and the run's report."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.policies.commitmoe.owa import commit_accuracy, default_trigger, owa_weights
from moesim.policies.contract.registry import make_policy
from moesim.policies.parts.predictors import TrainedPredictor
from moesim.sim.run.profile import profile_from_trace, trace_requests
from tests.util import DECODE, PREFILL, make_trace, run_engine, step_us, tiny_hw, tiny_model


def _lookahead(rows: list[list[list[int]]], E: int) -> np.ndarray:
    """Lookahead logits ``[T, L, E]`` ranking the listed experts first, in order."""
    T, L = len(rows), len(rows[0])
    la = np.zeros((T, L, E), dtype=np.float16)
    for t in range(T):
        for layer in range(L):
            for rank, e in enumerate(rows[t][layer]):
                la[t, layer, e] = 8.0 - rank
    return la


def _test1_trace():  # type: ignore[no-untyped-def]
    # t0: L0 [0], L1 [1]; t1: L0 [3], L1 [1]; lookahead t0 L0 -> 1, t0 L1 -> 2 (wrong), t1 L0 -> 1, t1 L1 -> 0
    return make_trace([[[0], [1]], [[3], [1]]], num_experts=4, lookahead=_lookahead([[[1], [2]], [[1], [0]]], 4))


@pytest.mark.parametrize("layer_us,commit,fallback", [
    (1500, [2550, 1550, 1550, 1550], [2550, 1550, 2550, 1550]),   # window > one load
    (600, [1650, 1000, 1000, 650], [1650, 1000, 2000, 650]),      # window < one load
])
def test_spec_test1_commitment_hides_a_misprediction(layer_us: float, commit: list[float],
                                                     fallback: list[float]) -> None:
    model, hw = tiny_model(2, 4, 1), tiny_hw(layer_us=layer_us, expert_us=50)
    eng_c, m_c = run_engine(_test1_trace(), make_policy("commitmoe"), model, hw, budget_experts=6)
    eng_f, m_f = run_engine(_test1_trace(), make_policy("prefetch-fallback"), model, hw, budget_experts=6)
    assert step_us(eng_c) == commit
    assert step_us(eng_f) == fallback
    assert m_c["misses"] == 1 and m_f["misses"] == 2          # one demand load vs two
    assert m_c["substitutions_per_token"] == 0.5                # t1 L0 runs 2 instead of 3
    assert m_c["policy_report"] == {"predictor": "lookahead", "committed_token_layers": 3,
                                    "commit_accuracy_pct": {"0": 1, "100": 2}, "owa_triggered": 0}
    if layer_us == 600:
        assert round(m_c["stall_ms"] * 1e3, 6) == 1700 and round(m_f["stall_ms"] * 1e3, 6) == 2700


def _test2(policy: str, order: str, **params):  # type: ignore[no-untyped-def]
    tr = make_trace([[[0, 1], [4, 5]]], num_experts=6, lookahead=_lookahead([[[2, 3], [0, 1]]], 6))
    return run_engine(tr, make_policy(policy, params), tiny_model(2, 6, 2), tiny_hw(layer_us=600, expert_us=50),
                      budget_experts=12, pcie_order=order)


def test_spec_test2_wrong_prefetches_queued() -> None:
    eng, m = _test2("commitmoe", "priority")
    assert step_us(eng) == [2650, 2000]                          # runs [2, 3] as they land
    assert m["substitutions_per_token"] == 2 and m["routing_mass_kept"] == 0.5  # L1 keeps 0, L0 all
    eng, m = _test2("prefetch-fallback", "priority")              # demand loads jump the queued (1,3)
    assert step_us(eng) == [2650, 3000]
    assert m["prefetch_gb"] == pytest.approx(0.006)             # (1,2) and (1,3) both copied
    eng, m = _test2("prefetch-fallback", "fifo")                  # behind every issued copy
    assert step_us(eng) == [2650, 4000]


def test_prefetch_fallback_cancels_queued_mispredictions() -> None:
    eng, m = _test2("prefetch-fallback", "priority", cancel_mispredicted=True)
    assert step_us(eng) == [2650, 3000]
    assert m["prefetch_gb"] == pytest.approx(0.003)             # (1,3) withdrawn before it started
    assert m["policy_report"]["cancelled_prefetches"] == 1
    _, m = _test2("prefetch-fallback", "fifo", cancel_mispredicted=True)   # fifo: nothing withdrawn
    assert m["policy_report"]["cancelled_prefetches"] == 0 and m["prefetch_gb"] == pytest.approx(0.006)


def test_spec_test3_owa_arithmetic() -> None:
    true, tw = [0, 1, 2, 3], [0.30, 0.20, 0.10, 0.05]            # A B C D
    pred, pw = [0, 1, 4, 5], [0.0, 0.0, 0.08, 0.04]              # A B E F (G_pred of A, B unused)
    np.testing.assert_allclose(owa_weights(true, tw, pred, pw, alpha1=1.3, alpha2=1.0),
                               [0.341503, 0.227668, 0.053886, 0.026943], atol=1e-6)
    np.testing.assert_allclose(owa_weights(true, tw, pred, pw, alpha1=1.0, alpha2=1.0),
                               [0.329221, 0.219481, 0.067532, 0.033766], atol=1e-6)
    got = owa_weights(true, tw, pred, pw, alpha1=1.3, alpha2=1.2)
    np.testing.assert_allclose(got, [0.409803, 0.273202, 0.064663, 0.032332], atol=1e-6)
    assert got.sum() == pytest.approx(0.78)
    assert default_trigger(4) == {2, 3} and default_trigger(2) == {1} and default_trigger(6) == {4, 5}
    assert 1 not in default_trigger(4) and 4 not in default_trigger(4)
    assert [commit_accuracy(4, 6), commit_accuracy(3, 4), commit_accuracy(1, 2)] == [67, 75, 50]


def test_owa_weights_reach_the_plan_only_in_the_trigger_range() -> None:
    # k=2, E=4: t0 L1 routed [1, 2]; commitment for t1 L0 from t0 L1's lookahead
    E = 4
    w = np.array([[[0.5, 0.3], [0.4, 0.2]], [[0.6, 0.1], [0.3, 0.3]]], dtype=np.float32)
    tr = make_trace([[[0, 1], [1, 2]], [[3, 0], [1, 2]]], num_experts=E, weights=w,
                    lookahead=_lookahead([[[1, 2], [0, 2]], [[1, 2], [0, 1]]], E))
    seen = []
    pol = make_policy("commitmoe", {"alpha1": 1.2, "alpha2": 1.06})
    orig = pol.on_routed

    def spy(view, layer, routing):  # type: ignore[no-untyped-def]
        plan = orig(view, layer, routing)
        seen.append(None if plan is None else (plan.experts.tolist(), plan.weights.tolist()))
        return plan
    pol.on_routed = spy  # type: ignore[method-assign]
    run_engine(tr, pol, tiny_model(2, E, 2), tiny_hw(), budget_experts=8)
    # t1 L0: committed [0, 2] vs true [3, 0]: one correct -> OWA (Mixtral's {1}); A = expert 0
    experts, weights = seen[2]
    assert experts == [[0, 2]]
    g_true0 = 0.1 * (1 + 0.6 / 0.1) * 1.2                        # Eq. 5 for the correct expert
    probs = np.exp(np.array([8.0, 0, 7.0, 0]) - 8.0)
    g_pred2 = probs[2] / probs.sum()
    scale = 0.7 / (g_true0 + g_pred2) * 1.06                     # Eq. 6
    np.testing.assert_allclose(weights[0], [g_true0 * scale, g_pred2 * scale], rtol=1e-5)
    # t1 L1: committed [1, 2] == true: no trigger, G_pred
    experts, weights = seen[3]
    assert experts == [[1, 2]]
    np.testing.assert_allclose(weights[0], [probs[0] / probs.sum(), probs[2] / probs.sum()], rtol=1e-5)


def _logit_trace(seed: int, requests: int = 6, tokens: int = 12, L: int = 3, E: int = 8, k: int = 2):  # type: ignore[no-untyped-def]
    """Router logits where layer l+1's are a fixed permutation of layer l's (plus noise), and the
    next token's layer 0 a permutation of the last layer's: a linear map predicts them."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(E)
    lg = np.zeros((requests * tokens, L, E), dtype=np.float32)
    reqs = []
    for r in range(requests):
        x = rng.normal(size=E) * 2
        for t in range(tokens):
            for layer in range(L):
                lg[r * tokens + t, layer] = x
                x = x[perm] + 0.1 * rng.normal(size=E)
            reqs.append(r)
    ex = np.argsort(-lg, axis=2, kind="stable")[:, :, :k]
    return make_trace(ex, num_experts=E, requests=reqs, logits=lg.astype(np.float16),
                      lookahead=np.roll(lg, -1, axis=1).astype(np.float16)), perm


def test_trained_predictor_learns_the_next_router_from_the_profile_only() -> None:
    tr, _ = _logit_trace(1)
    prof = profile_from_trace(tr, trace_requests(tr)[:3], "test")
    fitted = TrainedPredictor.fit(prof, lr=0.05, epochs=300, patience=20)
    assert len(fitted) == 3
    # predicts the held-out requests' next layer: top-1 of the prediction is the routed top-1
    lg = tr.logits.reshape(-1, 3, 8).astype(np.float64)[3 * 12:]
    ex = tr.experts.reshape(-1, 3, 2)[3 * 12:]
    hits = [np.mean(np.argmax(fitted[layer].probs(lg[:, layer]), axis=1) == ex[:, layer + 1, 0])
            for layer in range(2)]
    assert min(hits) > 0.9
    # the policy fits the same routers from the run's profile, whatever the measured requests hold
    other, _ = _logit_trace(2)   # different measured requests, same profile requests spliced in
    runs = []
    for measured in (tr, other):
        pol = make_policy("commitmoe", {"predictor": "trained"})
        _, m = run_engine(measured, pol, tiny_model(3, 8, 2), tiny_hw(), budget_experts=12, profile=prof)
        routers = pol._predictor.routers  # type: ignore[attr-defined]
        runs.append(routers)
        assert m["policy_report"]["predictor"] == "trained"
        assert m["policy_report"]["predictor_fit"].startswith("linear, 3 layers")
    for a, b, c in zip(runs[0], runs[1], fitted, strict=True):
        np.testing.assert_array_equal(a.weight, b.weight)
        np.testing.assert_array_equal(a.weight, c.weight)


def test_trained_predictor_needs_a_profile_split() -> None:
    from moesim.policies.contract.base import PolicySetupError
    tr, _ = _logit_trace(3)
    with pytest.raises(PolicySetupError, match="profile"):
        run_engine(tr, make_policy("commitmoe", {"predictor": "trained"}), tiny_model(3, 8, 2), tiny_hw(),
                   budget_experts=12)


def test_unknown_predictor_is_a_policy_error() -> None:
    from moesim.policies.contract.registry import PolicyError
    with pytest.raises(PolicyError, match="predictor must be one of auto, lookahead, trained, previous-token"):
        make_policy("commitmoe", {"predictor": "oracle"})


def test_without_lookahead_auto_commits_the_previous_tokens_routing_and_says_so() -> None:
    # t0 [0] [1]; t1 [3] [1]; t2 [3] [2]: previous-token predicts layer 1 of t0 from nothing,
    # then each layer from the token before (layer 0 after the last layer: this token's layer 0)
    tr = make_trace([[[0], [1]], [[3], [1]], [[3], [2]]], num_experts=4,
                    weights=np.full((3, 2, 1), 0.5, dtype=np.float32))
    pol = make_policy("commitmoe")
    plans = []
    orig = pol.on_routed

    def spy(view, layer, routing):  # type: ignore[no-untyped-def]
        plan = orig(view, layer, routing)
        plans.append(None if plan is None else (plan.experts.tolist(), plan.weights))
        return plan
    pol.on_routed = spy  # type: ignore[method-assign]
    _, m = run_engine(tr, pol, tiny_model(2, 4, 1), tiny_hw(), budget_experts=6)
    assert m["policy_report"]["predictor"] == "previous-token"
    assert any("no lookahead_logits" in w for w in m["warnings"])
    # t1 L0 commits t0's layer 0 ([0], wrong); t1 L1 t0's layer 1 ([1]); t2 L0 t1's layer 0 ([3])
    assert plans[2:] == [([[0]], None), ([[1]], None), ([[3]], None), ([[1]], None)]


def _previous_token_plans(phases: tuple[str, ...], predictor: str) -> list[tuple[int, int, object]]:
    """(iteration, layer, planned experts or None) of commitmoe(``predictor``) on two requests:
    request 0 prompt [0][1], [2][3], decode [1][2], [3][0]; request 1 prompt [3][2], decode [0][0]."""
    tr = make_trace([[[0], [1]], [[2], [3]], [[1], [2]], [[3], [0]], [[3], [2]], [[0], [0]]], num_experts=4,
                    requests=[0, 0, 0, 0, 1, 1], phases=[PREFILL, PREFILL, DECODE, DECODE, PREFILL, DECODE],
                    weights=np.full((6, 2, 1), 0.5, dtype=np.float32))
    pol = make_policy("commitmoe", {"predictor": predictor})   # auto: previous-token (no lookahead)
    plans: list[tuple[int, int, object]] = []
    orig = pol.on_routed

    def spy(view, layer, routing):  # type: ignore[no-untyped-def]
        plan = orig(view, layer, routing)
        plans.append((view.iteration_index, layer, None if plan is None else plan.experts.tolist()))
        return plan
    pol.on_routed = spy  # type: ignore[method-assign]
    run_engine(tr, pol, tiny_model(2, 4, 1), tiny_hw(), budget_experts=6, phases=phases)
    return plans


@pytest.mark.parametrize("predictor", ["previous-token", "auto"])
def test_previous_token_commitments_follow_the_request_across_a_prefill(predictor: str) -> None:
    # the first decode token commits layer 1 to its own last prompt token's layer 1 ([3]); a
    # prefill of several tokens used to make one commitment per prompt row (an IndexError)
    plans = _previous_token_plans(("prefill", "decode"), predictor)
    decode = [(layer, p) for it, layer, p in plans if it in (1, 2, 4)]
    assert decode == [(0, None), (1, [[3]]),     # t2: no commitment for layer 0 yet; layer 1 from t1
                      (0, [[1]]), (1, [[2]]),    # t3: layer 0 from t2 (cross-token), layer 1 from t2
                      (0, None), (1, [[2]])]     # t5: request 1's prompt gives layer 1 [2]


@pytest.mark.parametrize("predictor", ["previous-token", "auto"])
def test_previous_token_makes_no_commitment_from_another_request(predictor: str) -> None:
    # decode only: request 1's first token has no previous token in the replay, so it runs as
    # routed, not as request 0's last token did
    plans = _previous_token_plans(("decode",), predictor)
    assert plans[-2:] == [(2, 0, None), (2, 1, None)]
