"""The real executor (``moesim.sim.real.executor``) on a tiny random Mixtral on CPU: demand-only
policies give exactly the simulator's hits, misses and bytes on the same trace (the executor is
teacher-forced and its classification does not depend on timing), the model output does not
depend on where the experts live, and impossible runs are one-line errors."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesim.policies.contract.registry import make_policy  # noqa: E402
from moesim.sim.config.catalog import get_model  # noqa: E402
from moesim.sim.engine.cost import CostModel  # noqa: E402
from moesim.sim.engine.workload import build_workload  # noqa: E402
from tests.util import random_trace, run_engine, tiny_hw  # noqa: E402

SPEC = {"name": "tiny", "num_layers": 3, "num_experts": 8, "top_k": 2, "hidden_size": 32,
        "expert_intermediate_size": 64, "dtype_bytes": 4}


@cache
def _model() -> Any:
    from moesim.sim.real.executor.model import load

    return load(None, get_model(SPEC), torch.device("cpu"))


def _execute(policy: str, budget_experts: int, *, copy: str = "auto", initial: str = "empty",
             trace: Any = None) -> Any:
    from moesim.sim.real.executor.runner import Executor

    om = _model()
    tr = trace if trace is not None else random_trace(3, layers=3, experts=8, top_k=2, requests=2, prompt=3, decode=8)
    ex = Executor(build_workload(tr), make_policy(policy, {}), om, CostModel(om.spec, tiny_hw()),
                  budget_bytes=budget_experts * om.spec.expert_bytes, initial=initial, copy=copy)
    ex.run(warmup=1)
    return ex


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "belady", "random", "static", "no-cache"])
@pytest.mark.parametrize("budget", [3, 9])
def test_demand_policies_match_the_simulator(policy: str, budget: int) -> None:
    tr = random_trace(3, layers=3, experts=8, top_k=2, requests=2, prompt=3, decode=8)
    ex = _execute(policy, budget, trace=tr)
    real = ex.metrics()
    _, sim = run_engine(tr, make_policy(policy, {}), _model().spec, tiny_hw(), budget_experts=budget)
    assert (real["hits"], real["late"], real["misses"]) == (sim["hits"], sim["late"], sim["misses"])
    assert real["h2d_gb"] == pytest.approx(sim["h2d_gb"], abs=1e-12)
    assert real["evictions"] == sim["evictions"]
    assert real["output_tokens"] == sim["output_tokens"]
    assert all(t > 0 for t in ex.stats.iteration_s)


def test_synchronous_copies_give_the_same_hits() -> None:
    a = _execute("lru", 6, copy="sync").metrics()
    b = _execute("lru", 6, copy="thread").metrics()
    assert (a["hits"], a["misses"]) == (b["hits"], b["misses"])
    assert a["copy_engine"] == "sync" and b["copy_engine"] == "thread"


def test_popular_initial_fill_matches_the_simulator() -> None:
    tr = random_trace(5, layers=3, experts=8, top_k=2, requests=2, prompt=3, decode=8)
    real = _execute("lfu", 12, initial="popular", trace=tr).metrics()
    _, sim = run_engine(tr, make_policy("lfu", {}), _model().spec, tiny_hw(), budget_experts=12, initial="popular")
    assert (real["hits"], real["misses"]) == (sim["hits"], sim["misses"])
    assert real["hits"] > 0


def test_expert_placement_does_not_change_the_output() -> None:
    """The MoE output computed from device slots equals the one computed from the host pool."""
    from moesim.sim.real.executor.kernels import apply_expert
    from moesim.sim.real.executor.plan import access_order, combine_weights

    om = _model()
    x = torch.randn(4, om.hidden)
    logits = torch.randn(4, 8)
    plan = np.array([[0, 3], [3, 5], [7, 0], [1, 2]])
    w = combine_weights(logits, plan)
    assert torch.allclose(w.sum(dim=1), torch.ones(4))
    exps, rows = access_order(plan, plan >= 0)
    assert exps == [0, 3, 5, 7, 1, 2]
    host = torch.zeros_like(x)
    dev = torch.zeros_like(x)
    slab = torch.zeros(len(exps), om.host_experts[0].shape[1])
    for i, e in enumerate(exps):
        slab[i].copy_(om.host_experts[1][e])
        tok, slot = rows[e]
        apply_expert(host, x, w, tok, slot, om.host_experts[1][e], om.hidden, om.inter)
        apply_expert(dev, x, w, tok, slot, slab[i], om.hidden, om.inter)
    assert torch.equal(host, dev)
    assert host.abs().sum() > 0


def test_too_small_a_budget_is_one_line() -> None:
    from moesim.sim.core.errors import MoesimError

    with pytest.raises(MoesimError, match="budget"):
        _execute("lru", 1)


class _StreamLikeCopier:
    """A copy engine that behaves as a CUDA stream seen from the host: every copy starts at once
    and cannot be withdrawn, and none lands until the host waits for it."""

    name = "stream-like"

    def __init__(self) -> None:
        from moesim.sim.real.executor.copier import SyncCopier

        self._sync = SyncCopier()

    def submit(self, key: Any, src: Any, dst: Any, cls: int, priority: float = 0.0, after: Any = None) -> Any:
        job = self._sync.submit(key, src, dst, cls, priority)
        job.finished = False
        return job

    def done(self, job: Any) -> bool:
        return bool(job.finished)

    def started(self, job: Any) -> bool:
        return True

    def wait(self, jobs: list[Any]) -> None:
        jobs[0].finished = True

    def cancel(self, job: Any) -> bool:
        return False

    def reprioritize(self, job: Any, priority: float) -> bool:
        return False

    def busy_s(self) -> float:
        return self._sync.busy_s()

    def close(self) -> None:
        pass


def test_demand_load_waits_for_room_held_by_started_prefetches() -> None:
    """Speculative prefetches that cannot be withdrawn (a CUDA stream) can fill a layer's pool
    with experts the layer does not use; a demand load then waits for one to land and evicts it.
    On this trace and budget (2 experts per layer) that was an error ('the expert budget is too
    small'), first met on an H100."""
    from moesim.sim.real.executor.model import load
    from moesim.sim.real.executor.runner import Executor
    from moesim.traces.format.trace_file import trace_from_columns
    from moesim.traces.synthetic.generator import generate, parse_params

    spec = dict(SPEC, name="tiny4", num_layers=4)
    om = load(None, get_model(spec), torch.device("cpu"))
    tr = trace_from_columns(*generate(parse_params({"preset": "mixtral-8x7b", "num_layers": 4, "requests": 2,
                                                    "prompt_len": 16, "decode_len": 32, "seed": 0})))
    ex = Executor(build_workload(tr, phases=["prefill", "decode"]), make_policy("mixtral-offloading", {}), om,
                  CostModel(om.spec, tiny_hw()), budget_bytes=8 * om.spec.expert_bytes)
    ex.res.copier.close()
    ex.res.copier = _StreamLikeCopier()
    ex.run(warmup=1)
    met = ex.metrics()
    assert met["output_tokens"] == 2 * 33 and met["misses"] > 0 and met["prefetch_gb"] > 0
