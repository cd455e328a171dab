"""When a layer needs more experts than its pool holds, the GPU computes one expert at a time in
a fixed order (resident or in flight at routing first, then demand loads in access order), so
victim choices do not depend on when copies land: the simulator's exact timeline on a hand
case, and the real executor's hit rate equal to the simulator's in every repeated run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moesim.policies.contract.registry import make_policy
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.traces.format.trace_file import DECODE, PREFILL
from tests.util import make_trace, tiny_hw, tiny_model

ROOT = Path(__file__).resolve().parents[1]


def test_hand_case_timeline() -> None:
    """Pool of 3, top-1. Request 0 decodes experts 3 and 4 (both stay resident). Request 1's
    prefill routes its 5 tokens to experts 0-4: 3 and 4 hit, 0 gets the free slot, 1 and 2 wait
    for room. Loads take 100 us, an expert 500 us, the layer 100 us.

    t=100 the layer is routed, 0 starts loading (lands at 200); 3 computes (100-600), frees room
    for 1 (lands at 700); 4 computes next although 0 landed first (600-1100), freeing room for
    2 (lands at 1200); nothing waits any more, so 0 and 1 compute together (1100-2100), then 2
    (2100-2600)."""
    trace = make_trace([[[3]], [[4]], [[0]], [[1]], [[2]], [[3]], [[4]]], num_experts=5,
                       requests=[0, 0, 1, 1, 1, 1, 1],
                       phases=[DECODE, DECODE, PREFILL, PREFILL, PREFILL, PREFILL, PREFILL])
    model = tiny_model(1, 5, 1)
    wl = build_workload(trace, batch_size=1, phases=["prefill", "decode"])
    for fast in (FAST_PATH, None):   # the fast path's driver (a timeline: no kernel) and the event loop
        eng = Engine(wl, make_policy("lru"), CostModel(model, tiny_hw(pcie_gbps=30.0, expert_us=500.0)),
                     budget_bytes=3 * model.expert_bytes, record_timeline=True, check_invariants=True,
                     fast_replay=fast)
        eng.run()
        assert eng.state.path == ("fast" if fast else "event")
        prefill_start = eng.state.steps.columns()["t_start"][-1]
        gpu = [(round((t - prefill_start) * 1e6), sorted(info["experts"]))
               for lane, label, t, dt, info in eng.state.timeline if lane == "GPU" and "experts" in label
               and t >= prefill_start]
        assert gpu == [(100, [3]), (600, [4]), (1100, [0, 1]), (2100, [2])]


@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_executor_hit_rate_equals_the_simulators_in_every_run(policy: str) -> None:
    """The bundled tiny MoE's prefill at cache rate 0.25 needs all 16 experts of a layer through
    4 slots; the hit rate of each of three executor runs equals the simulator's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.real.calibration.profile import write_profile
    from moesim.sim.real.executor.model import load, model_argument
    from moesim.sim.real.validate import execute_repeated, simulate
    from moesim.sim.run.runner import load_trace

    loaded = load_scenario(ROOT / "scenarios/validate-cpu.yaml", [f"policy={policy}", "cache.rate=0.25",
                                                                 "workload.requests=1"])
    trace = load_trace(loaded)
    ref, spec = model_argument(None, loaded.model_spec(trace.model.name))
    om = load(ref, spec, torch.device("cpu"))
    profile = _profile(om.spec)
    real = execute_repeated(loaded, om, write_profile(profile, _tmp() / "p.yaml", force=True), trace,
                            repeats=3, keep_awake=False)
    sim = simulate(loaded, om.spec, _tmp() / "p.yaml", trace)
    assert real["hit_rate_runs"] == [sim["hit_rate"]] * 3
    assert 0.5 < sim["hit_rate"] < 1.0


def _tmp() -> Path:
    import tempfile

    d = Path(tempfile.gettempdir()) / "moesim-fixed-order"
    d.mkdir(exist_ok=True)
    return d


def _profile(spec: Any) -> dict[str, object]:
    """A profile of round numbers (no measurement needed: only the hit rates are compared)."""
    return {"hardware": {"name": "t", "vram_gib": 1, "pcie_gbps": 10.0, "peak_tflops": 1, "hbm_gbps": 10,
                         "costs": {"layer_us": 200.0, "expert_us": 70.0, "head_us": 30.0}},
            "runtime": {"name": "t", "layer_us": 100.0},
            "model": spec.model_dump(mode="json")}
