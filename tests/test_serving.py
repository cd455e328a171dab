"""Serving (workload.arrivals, workload.scheduler, slo): exact timelines of a two-request arrival
case under continuous and static batching, properties (no request starts before it arrives;
weights + KV + experts within VRAM; far-apart arrivals replay as the one-request replay), the
serving metrics and one-line refusals of bad request logs and keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.baselines.caching import LRU
from moesim.sim.config.catalog import GIB
from moesim.sim.config.scenario import ScenarioError, load_scenario
from moesim.sim.config.serving_spec import SloSpec
from moesim.sim.engine.arrivals import Arrivals, poisson_arrivals
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.serving_workload import serving_workload
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.sim.run.runner import run_loaded
from moesim.sim.run.serving_metrics import serving_metrics
from tests.bad_input import Case, Corpus, check, scen
from tests.test_context import attn_model, slope_hw
from tests.util import PREFILL, ROOT, make_trace, random_trace, steps, tiny_hw, tiny_model


def _two_requests() -> Any:
    # one layer; request 0: a 2-token prompt on expert 0 then 1 decode token on expert 0;
    # request 1: a 1-token prompt on expert 1 then 1 decode token on expert 1
    return make_trace([[[0]], [[0]], [[0]], [[1]], [[1]]], num_experts=2, requests=[0, 0, 0, 1, 1],
                      phases=[PREFILL, PREFILL, 1, PREFILL, 1])


def _serve(trace: Any, arrivals: Arrivals, kind: str, *, max_batch: int = 2, max_tokens: int = 8,
           budget: int = 2, model: Any = None, hw: Any = None, context: int = 0,
           chosen: list[int] | None = None, policy: Any = None) -> Engine:
    # budget: experts in all (split among layers)
    model = model or tiny_model(trace.model.num_layers, trace.model.num_experts, trace.model.top_k)
    wl = serving_workload(trace, chosen if chosen is not None else sorted(set(trace.request_id.tolist())),
                          ("prefill", "decode"), arrivals, kind=kind, max_batch=max_batch, max_tokens=max_tokens,
                          context_tokens=context, kv_modelled=model.kv_bytes_per_token is not None)
    eng = Engine(wl, policy or LRU(), CostModel(model, hw or tiny_hw()), budget_bytes=budget * model.expert_bytes,
                 check_invariants=True, fast_replay=FAST_PATH)
    eng.run()
    return eng


def _us(values: Any) -> list[float]:
    return [round(float(v) * 1e6, 6) for v in values]


def test_two_requests_continuous_exact_timeline() -> None:
    # layer 100 us, expert 50 us, a 3 MB copy 1000 us. r0 arrives at 0: its 2-token prompt misses
    # expert 0 (0..1150 us, first token). r1 arrives at 500 us and joins at the boundary (1150):
    # r0's decode token (expert 0, a hit, computed 1250..1300) and r1's prompt (expert 1, a miss
    # copied 1250..2250, computed ..2300); r0 finishes at 2300. r1 decodes alone (hit): 2450.
    eng = _serve(_two_requests(), Arrivals(np.array([0.0, 500e-6])), "continuous")
    rec = steps(eng)
    assert [(s.iteration, round(s.t_start * 1e6, 6), round(s.t_end * 1e6, 6), s.hits, s.misses) for s in rec] == [
        (0, 0.0, 1150.0, 0, 1), (1, 1150.0, 2300.0, 1, 1), (2, 2300.0, 2450.0, 1, 0)]
    sched = eng.state.scheduler
    assert sched is not None
    assert _us(sched.admitted) == [0.0, 1150.0]
    assert _us(sched.first_token) == [1150.0, 2300.0]
    assert _us(sched.finish) == [2300.0, 2450.0]
    sv = serving_metrics(sched, compute_metrics(eng.state)["sim_time_s"], SloSpec(ttft_ms=1.5, tpot_ms=1.0))
    assert sv["ttft_ms"]["p50"] == pytest.approx((1.150 + 1.800) / 2)
    assert sv["queue_ms"]["mean"] == pytest.approx(0.650 / 2)
    assert sv["e2e_ms"]["p99"] == pytest.approx(2.300 - (2.300 - 1.950) * 0.01)
    assert sv["tpot_ms"]["p50"] == pytest.approx((1.150 + 0.150) / 2)   # r0: (2300 - 1150) / 1; r1: 2450 - 2300
    assert (sv["slo_met"], sv["goodput_rps"]) == (0, 0.0)   # r0: TPOT 1.15 ms > 1; r1: TTFT 1.8 ms > 1.5
    m = compute_metrics(eng.state)
    assert (m["iterations"], m["tokens"], m["output_tokens"]) == (3, 5, 4)
    assert m["engine_path"] == "fast"   # the driver (tests/test_fastdriver_serving.py); no kernel


def test_a_serving_run_at_context_0_reads_and_holds_its_own_kv_cache_exact_timeline() -> None:
    # the continuous case above with Mixtral's attention shape (4 KiB of KV per token) and reads
    # of 2 us per KV token, from a starting context of 0: each iteration reads its requests' own
    # tokens. 0: r0's 2-token prompt reads 2 (pairs 0 x 2 + 3) -> 104 + 1000 + 50 = 1154.
    # 1: r0's decode token reads 2 + 1, r1's 1-token prompt 1 -> 4 tokens, 108: 1154 + 1158 = 2312.
    # 2: r1's decode token reads 1 + 1 -> 154: 2466. The VRAM keeps the bound of the two requests'
    # ends (3 + 2 tokens); what was live at most is r0's 3 and r1's 1.
    model = attn_model()
    eng = _serve(_two_requests(), Arrivals(np.array([0.0, 500e-6])), "continuous", model=model, hw=slope_hw())
    rec = steps(eng)
    assert [(s.iteration, round(s.t_start * 1e6, 6), round(s.t_end * 1e6, 6), s.hits, s.misses) for s in rec] == [
        (0, 0.0, 1154.0, 0, 1), (1, 1154.0, 2312.0, 1, 1), (2, 2312.0, 2466.0, 1, 0)]
    sched = eng.state.scheduler
    assert sched is not None
    assert _us(sched.first_token) == [1154.0, 2312.0] and _us(sched.finish) == [2312.0, 2466.0]
    wl = eng.state.workload
    assert wl.kv_modelled and wl.context_tokens == 0 and wl.peak_kv_tokens == 5
    assert sched.live_kv_peak == 4
    from moesim.sim.run.kv_budget import kv_bytes
    assert kv_bytes(model, wl) == 5 * 4096
    assert serving_metrics(sched, 2466e-6, None)["kv_live_peak_tokens"] == 4


def test_two_requests_static_exact_timeline() -> None:
    # static: r0's batch runs alone (prompt 0..1150, decode hit 1150..1300); r1, arrived at 500 us,
    # waits for it: prompt miss 1300..2450, decode 2450..2600
    eng = _serve(_two_requests(), Arrivals(np.array([0.0, 500e-6])), "static")
    rec = steps(eng)
    assert [(round(s.t_start * 1e6, 6), round(s.t_end * 1e6, 6)) for s in rec] == [
        (0.0, 1150.0), (1150.0, 1300.0), (1300.0, 2450.0), (2450.0, 2600.0)]
    sched = eng.state.scheduler
    assert sched is not None
    assert _us(sched.admitted) == [0.0, 1300.0] and _us(sched.first_token) == [1150.0, 2450.0]


def test_an_idle_gpu_waits_for_the_next_arrival_and_chunks_long_prompts() -> None:
    # r1 arrives at 10 ms, after r0 finished (2 ms): the GPU idles until then. With max_tokens 2
    # a 3-token prompt runs as chunks of 2 and 1 tokens.
    tr = make_trace([[[0]]] * 4 + [[[1]]] * 2, num_experts=2, requests=[0, 0, 0, 0, 1, 1],
                    phases=[PREFILL, PREFILL, PREFILL, 1, PREFILL, 1])
    eng = _serve(tr, Arrivals(np.array([0.0, 0.010])), "continuous", max_tokens=2)
    rec = steps(eng)
    starts = _us(s.t_start for s in rec)
    # r0: chunk of 2 (miss: 1150), chunk of 1 (150: first token at 1300), decode 150
    assert starts == [0.0, 1150.0, 1300.0, 10000.0, 11150.0]
    sched = eng.state.scheduler
    assert sched is not None
    assert _us(sched.first_token) == [1300.0, 11150.0] and _us(sched.admitted) == [0.0, 10000.0]


def _one_request_replay(trace: Any, model: Any, hw: Any, budget: int, requests: list[int]) -> Engine:
    wl = build_workload(trace, batch_size=1, phases=("prefill", "decode"), requests=requests)
    eng = Engine(wl, LRU(), CostModel(model, hw), budget_bytes=budget * model.expert_bytes, check_invariants=True)
    eng.run()
    return eng


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 4), budget=st.integers(2, 8),
       kind=st.sampled_from(["static", "continuous"]))
def test_far_apart_arrivals_replay_as_the_one_request_replay(seed: int, n: int, budget: int, kind: str) -> None:
    # arrivals 1000 s apart: every request runs alone on a cache left by the ones before, as in
    # the lockstep replay of batch 1 (LRU: every copy lands within its layer): the same steps,
    # shifted by the idle time, and the same per-request token gaps
    tr = random_trace(seed, layers=3, experts=8, top_k=2, requests=n, prompt=3, decode=5)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    served = _serve(tr, Arrivals(np.arange(n) * 1000.0), kind, max_batch=4, budget=3 * budget, model=model, hw=hw)
    alone = _one_request_replay(tr, model, hw, 3 * budget, list(range(n)))
    a, b = served.state.steps.columns(), alone.state.steps.columns()
    for col in ("hits", "misses", "late", "demand_bytes", "n_experts"):
        np.testing.assert_array_equal(a[col], b[col])
    np.testing.assert_allclose(a["t_end"] - a["t_start"], b["t_end"] - b["t_start"], rtol=0, atol=1e-9)
    for r in range(n):
        ta = np.diff([r * 1000.0, *served.state.stats.token_end[r]])
        tb = np.diff([alone.state.stats.request_start[r], *alone.state.stats.token_end[r]])
        np.testing.assert_allclose(ta, tb, rtol=0, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), rate=st.floats(10.0, 5000.0),
       kind=st.sampled_from(["static", "continuous"]), max_batch=st.integers(1, 4), max_tokens=st.integers(4, 9))
def test_no_request_starts_before_it_arrives(seed: int, n: int, rate: float, kind: str, max_batch: int,
                                             max_tokens: int) -> None:
    tr = random_trace(seed % 7, layers=2, experts=8, top_k=2, requests=3, prompt=5, decode=3)
    arrivals = poisson_arrivals(rate, n, seed)
    seen: list[tuple[float, list[int]]] = []   # each iteration's start and requests, as the policy sees them

    class Watching(LRU):
        def on_iteration_start(self, view: Any) -> None:
            seen.append((view.now, view.iteration.request_ids.tolist()))

    eng = _serve(tr, arrivals, kind, max_batch=max_batch, max_tokens=max_tokens, budget=6, policy=Watching())
    sched = eng.state.scheduler
    assert sched is not None
    arr = arrivals.times
    assert (sched.admitted >= arr).all() and (sched.first_token > sched.admitted).all()
    assert (sched.finish >= sched.first_token).all() and sched.finished == n
    # every iteration that runs a request's token starts at or after its arrival
    assert len(seen) == sched.count
    for t, rids in seen:
        assert all(t >= arr[r] for r in rids)
    cols = eng.state.steps.columns()
    assert int(sched.tokens_out.sum()) == sum(len(v) for v in eng.state.stats.token_end.values())
    assert (np.diff(cols["t_start"]) >= 0).all()
    assert sched.count == int(cols["iteration"].max()) + 1
    # each request gives one token per decode row plus one for its prompt
    plan = sched.plan
    assert [int(x) for x in sched.tokens_out] == [plan.outputs(r) for r in range(n)]


@settings(max_examples=25, deadline=None)
@given(context=st.one_of(st.just(0), st.integers(0, 20_000)), n=st.integers(1, 6), max_batch=st.integers(1, 4),
       epl=st.integers(1, 8))
def test_weights_kv_and_experts_never_exceed_vram_when_serving(context: int, n: int, max_batch: int, epl: int) -> None:
    # the KV cache is reserved at the bound (the max_batch largest requests' ends, never 0: from a
    # starting context of 0 the requests hold their own tokens): the live KV never exceeds it, and
    # the weights, the reserved KV and the experts' peak fit in VRAM
    from moesim.sim.run.kv_budget import kv_budget, kv_bytes
    tr = random_trace(1, layers=2, experts=8, top_k=2, requests=3, prompt=3, decode=4)
    model = attn_model(2, 8, 2).model_copy(update={"non_expert_bytes": 100 * 2**20})
    hw = slope_hw(vram_gib=0.25)
    wl = serving_workload(tr, [0, 1, 2], ("prefill", "decode"), poisson_arrivals(500.0, n, context),
                          kind="continuous", max_batch=max_batch, max_tokens=8, context_tokens=context,
                          kv_modelled=True)
    assert wl.peak_kv_tokens >= min(n, max_batch) * (context + 7) and kv_bytes(model, wl) > 0
    try:
        budget = kv_budget("s", "experts_per_layer", model, hw, wl, epl * 2 * model.expert_bytes, 0)
    except ScenarioError:
        assert model.non_expert_bytes + kv_bytes(model, wl) > hw.vram_gib * GIB
        return
    eng = Engine(wl, LRU(), CostModel(model, hw), budget_bytes=budget, check_invariants=True)
    eng.run()
    sched = eng.state.scheduler
    assert sched is not None and 0 < sched.live_kv_peak <= wl.peak_kv_tokens
    used = model.non_expert_bytes + kv_bytes(model, wl) + eng.state.stats.vram_peak_bytes
    assert used <= hw.vram_gib * GIB


def _serving_yaml(tmp_path: Path, **workload: Any) -> Path:
    text = scen(workload__phases=["prefill", "decode"], **{f"workload__{k}": v for k, v in workload.items()})
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_a_rate_run_reports_serving_metrics_and_absent_keys_change_nothing(tmp_path: Path) -> None:
    path = _serving_yaml(tmp_path, arrivals={"rate": 50.0, "requests": 6},
                         scheduler={"kind": "continuous", "max_batch": 2, "max_tokens": 64})
    text = path.read_text() + "slo: {ttft_ms: 1000, tpot_ms: 50}\n"
    path.write_text(text)
    res = run_loaded(load_scenario(path))
    sv = res.metrics["serving"]
    assert sv["requests"] == sv["finished"] == 6 and sv["scheduler"] == "continuous"
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms"):
        assert set(sv[key]) == {"mean", "p50", "p90", "p99"}
        assert sv[key]["p50"] <= sv[key]["p90"] <= sv[key]["p99"]
    assert 0.0 <= sv["slo_attainment"] <= 1.0 and sv["goodput_rps"] <= sv["requests_per_s"]
    assert res.metrics["requests"] == 6
    again = run_loaded(load_scenario(path))   # seeded: the same arrivals, the same numbers
    assert again.metrics["serving"] == sv
    plain = tmp_path / "p.yaml"
    plain.write_text(scen(workload__phases=["prefill", "decode"]))
    assert "serving" not in run_loaded(load_scenario(plain)).metrics


def test_a_request_log_replays_its_lengths(tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.5,4,3\n0,2,1\n")
    path = _serving_yaml(tmp_path, arrivals={"file": "log.csv"}, scheduler={"kind": "static", "max_batch": 2})
    res = run_loaded(load_scenario(path))
    sv = res.metrics["serving"]
    # sorted by arrival: (0 s, 2, 1) then (0.5 s, 4, 3): 2 + (4 + 2) tokens, 1 + 3 outputs
    assert (sv["tokens"], res.metrics["output_tokens"], sv["finished"]) == (8, 4, 2)
    assert res.config["workload"]["arrivals"]["file"] == str((tmp_path / "log.csv").resolve())


def test_oracle_policies_are_refused_with_arrivals(tmp_path: Path) -> None:
    path = _serving_yaml(tmp_path, arrivals={"rate": 10.0})
    with pytest.raises(ScenarioError, match="oracle"):
        run_loaded(load_scenario(path, ["policy=belady"]))


CORPUS = Corpus()
_LOG = "arrival_s,prompt_tokens,output_tokens\n"
for _id, _log, _culprit in [
    ("missing-column", "arrival_s,prompt_tokens\n0,1\n", "output_tokens"),
    ("negative-arrival", _LOG + "0,1,1\n-1,1,1\n", "row 2"),
    ("not-a-number", _LOG + "0,x,1\n", "prompt_tokens"),
    ("zero-output", _LOG + "0,1,0\n", "output_tokens"),
    ("empty", _LOG, "no requests"),
]:
    CORPUS.scenario_case(f"arrivals-{_id}", scen(workload__arrivals={"file": "log.csv"}), "log.csv", _culprit,
                         files={"log.csv": _log})
CORPUS.scenario_case("arrivals-missing-file", scen(workload__arrivals={"file": "nope.csv"}), "nope.csv")
CORPUS.scenario_case("arrivals-bad-suffix", scen(workload__arrivals={"file": "log.txt"}), "log.txt", ".csv",
                     files={"log.txt": _LOG + "0,1,1\n"})
CORPUS.scenario_case("arrivals-rate-and-file", scen(workload__arrivals={"rate": 1, "file": "x.csv"}),
                     "workload.arrivals")
CORPUS.scenario_case("arrivals-zero-rate", scen(workload__arrivals={"rate": 0}), "workload.arrivals.rate")
CORPUS.scenario_case("scheduler-without-arrivals", scen(workload__scheduler={"kind": "static"}), "scheduler")
CORPUS.scenario_case("scheduler-unknown-kind", scen(workload__arrivals={"rate": 1}, workload__scheduler={"kind": "fcfs"}),
                     "workload.scheduler.kind")
CORPUS.scenario_case("scheduler-tokens-below-batch",
                     scen(workload__arrivals={"rate": 1}, workload__scheduler={"max_batch": 8, "max_tokens": 4}),
                     "max_tokens")
CORPUS.scenario_case("slo-without-arrivals", scen(slo={"ttft_ms": 100}), "slo")
# flame-moe-290m's weights (368.1 MiB) fit in 369.7 MiB, its running batch's KV cache beside them
# (the 2 requests' ends, 128 tokens x 4 KiB x 9 layers = 4.5 MiB, from a starting context of 0) does not
CORPUS.scenario_case("serving-kv-does-not-fit",
                     scen(workload__arrivals={"rate": 1}, workload__phases=["prefill", "decode"],
                          hardware={"base": "rtx-4090", "vram_gib": 0.361}),
                     "workload.scheduler.max_batch", "KV cache of the running batch")
CORPUS.scenario_case("batch-size-with-arrivals", scen(workload__arrivals={"rate": 1}, workload__batch_size=2),
                     "batch_size")


@pytest.mark.parametrize("c", CORPUS.cases, ids=[c.id for c in CORPUS.cases])
def test_bad_serving_input_is_one_line(c: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    check(c, tmp_path, monkeypatch, capsys)


def test_the_serving_scenario_is_runnable() -> None:
    res = run_loaded(load_scenario(ROOT / "scenarios" / "serving" / "mixtral-continuous.yaml",
                                   ["workload.arrivals.requests=3"]), steps=False)
    assert res.metrics["serving"]["finished"] == 3


def test_a_serving_run_with_a_context_keeps_the_kv_bound_in_vram() -> None:
    # Mixtral from a 4096-token context, 4 requests of up to 2 at once: the KV bound is the two
    # largest ends (4096 + 32 + 48 tokens each), what was live never exceeds it
    scen = ROOT / "scenarios" / "mixtral-a100-batch4.yaml"
    res = run_loaded(load_scenario(scen, ["workload.batch_size=1", "workload.arrivals.rate=20",
                                          "workload.arrivals.requests=4", "workload.scheduler.max_batch=2",
                                          "workload.context_tokens=4096"]), steps=False)
    m = res.metrics
    assert m["kv_peak_tokens"] == 2 * (4096 + 32 + 48)
    assert m["serving"]["kv_live_peak_tokens"] <= m["kv_peak_tokens"]
    assert m["kv_gib"] > 0 and m["serving"]["finished"] == 4


def _summary(res: Any) -> str:
    import io

    from rich.console import Console

    from moesim.sim.run.outputs import print_summary
    console = Console(width=1000, record=True, file=io.StringIO())
    print_summary(res, console)
    return console.export_text()


def test_a_serving_run_at_context_0_holds_its_kv_cache_and_says_so() -> None:
    # Mixtral, 4 requests of up to 2 at once, no starting context: the KV bound is the two largest
    # ends (32 + 48 tokens each), in metrics.json, the summary and the VRAM peak
    scen = ROOT / "scenarios" / "mixtral-a100-batch4.yaml"
    res = run_loaded(load_scenario(scen, ["workload.batch_size=1", "workload.arrivals.rate=20",
                                          "workload.arrivals.requests=4", "workload.scheduler.max_batch=2"]), steps=False)
    m = res.metrics
    assert (m["context_tokens"], m["kv_peak_tokens"]) == (0, 2 * (32 + 48))
    assert m["kv_gib"] == pytest.approx(160 * 4096 * 32 / GIB) and m["experts_held"] > 0
    assert 0 < m["serving"]["kv_live_peak_tokens"] <= m["kv_peak_tokens"]
    assert "kv_cache" not in m
    assert "kept for the running batch at its bound (160 tokens: the 2 largest requests' ends from a starting " \
           "context of 0" in _summary(res)


def test_a_serving_run_of_a_model_without_an_attention_shape_says_its_kv_cache_is_not_modelled() -> None:
    scen = ROOT / "scenarios" / "mixtral-4090-lru.yaml"
    bare = "{name: bare, num_layers: 32, num_experts: 8, top_k: 2, hidden_size: 4096, expert_intermediate_size: 14336, dtype_bytes: 0.5}"
    res = run_loaded(load_scenario(scen, [f"model={bare}", "workload.arrivals.rate=20", "workload.arrivals.requests=2",
                                          "workload.requests=1"]), steps=False)
    m = res.metrics
    assert m["kv_cache"].startswith("not modelled: model bare gives no attention shape")
    assert "kv_gib" not in m and "kv_live_peak_tokens" not in m["serving"]
    assert "not modelled: model bare gives no attention shape" in _summary(res).replace("\n", " ")
    # a starting context on such a model is still refused in one line
    with pytest.raises(ScenarioError, match="gives no attention shape"):
        run_loaded(load_scenario(scen, [f"model={bare}", "workload.arrivals.rate=20", "workload.context_tokens=10"]))


def test_a_serving_sweep_plots_latency_against_throughput(tmp_path: Path) -> None:
    import yaml

    from moesim.sim.cli.main import main
    from moesim.sim.study.sweep import SweepSpec, expand
    from moesim.sim.study.sweep_run import run_sweep

    base = yaml.safe_load(scen(workload__phases=["prefill", "decode"], workload__arrivals={"rate": 5.0, "requests": 3}))
    sweep = expand(SweepSpec(name="s", base=base, grid={"policy": ["lru", "lfu"], "workload.arrivals.rate": [5.0, 50.0]}),
                   source="s", base_dir=tmp_path)
    outcome = run_sweep(sweep, tmp_path / "sweep", jobs=1)
    assert main(["plot", str(tmp_path / "sweep"), "--kind", "latency-throughput", "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "latency_throughput.png").stat().st_size > 0
    import pandas as pd
    table = pd.read_parquet(outcome.table)
    assert {"serving_ttft_ms_p99", "serving_goodput_rps"} - set(table.columns) == {"serving_goodput_rps"}   # no slo
