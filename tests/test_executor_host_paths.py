"""The executor's two host paths on a tiny random Mixtral on CPU: copies from pageable memory
(``accelerate``: an unpinned pool, synchronous copies, a layer that waits for every expert's copy
through ``Plan.wait_for``) and experts computed on the host's cores (``cpu-moe``, ``fiddler``).
Hits, misses, CPU accesses and bytes equal the simulator's on the same trace (the executor is
teacher-forced), and an expert's output does not depend on whether the host computed it. On a
GPU the same code copies from pageable memory through the CUDA driver and runs CPU experts on
the host while the GPU runs the resident ones (``docs/calibration.md``, "Measured on an H200")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesim.policies.contract.registry import make_policy  # noqa: E402
from moesim.sim.engine.cost import CostModel  # noqa: E402
from moesim.sim.engine.workload import build_workload  # noqa: E402
from tests.test_executor import _model  # noqa: E402  (the same tiny random Mixtral, built once)
from tests.util import random_trace, run_engine, tiny_hw  # noqa: E402


def _both(policy: str, params: dict[str, Any], budget: int, copy: str = "auto",
          phases: tuple[str, ...] = ("decode",)) -> tuple[Any, dict[str, Any]]:
    """The executor's run and the simulator's metrics of one policy on one trace."""
    from moesim.sim.real.executor.runner import Executor

    om = _model()
    tr = random_trace(7, layers=3, experts=8, top_k=2, requests=2, prompt=3, decode=6)
    ex = Executor(build_workload(tr, phases=list(phases)), make_policy(policy, params), om,
                  CostModel(om.spec, tiny_hw()), budget_bytes=budget * om.spec.expert_bytes, copy=copy)
    ex.run(warmup=1)
    _, sim = run_engine(tr, make_policy(policy, params), om.spec, tiny_hw(), budget_experts=budget,
                        phases=list(phases))
    return ex, sim


@pytest.mark.parametrize("budget", [9, 17])
def test_accelerate_streams_whole_layers_from_pageable_memory(budget: int) -> None:
    ex, sim = _both("accelerate", {"stream_non_expert": False}, budget)
    real = ex.metrics()
    assert ex.pageable and real["copy_engine"] == "sync"
    assert not any(t.is_pinned() for t in ex.res.store.host)
    assert (real["hits"], real["late"], real["misses"]) == (sim["hits"], sim["late"], sim["misses"])
    assert real["h2d_gb"] == pytest.approx(sim["h2d_gb"], abs=1e-12)
    # every streamed layer copies all 8 experts each pass: routed ones on demand, the rest waited for
    streamed = 3 - (budget // 8 - 1)
    iterations = len(ex.stats.iteration_s)
    assert real["h2d_gb"] == pytest.approx(iterations * streamed * 8 * _model().spec.expert_bytes / 1e9)


def test_pageable_copies_refuse_an_asynchronous_copy_engine() -> None:
    from moesim.sim.real.executor.residency import ExecutorError

    with pytest.raises(ExecutorError, match="pageable memory, synchronously"):
        _both("accelerate", {}, 9, copy="thread")


@pytest.mark.parametrize(("policy", "params", "budget"), [
    ("cpu-moe", {"n_cpu_moe": 1}, 16),
    ("cpu-moe", {"n_cpu_moe": 2}, 8),
    ("fiddler", {"decision": "repo"}, 6),
])
def test_cpu_experts_match_the_simulator(policy: str, params: dict[str, Any], budget: int) -> None:
    ex, sim = _both(policy, params, budget)
    real = ex.metrics()
    assert real["cpu_expert_runs"] == sim["cpu_expert_runs"] > 0
    assert (real["hits"], real["late"], real["misses"]) == (sim["hits"], sim["late"], sim["misses"])
    assert real["h2d_gb"] == pytest.approx(sim["h2d_gb"], abs=1e-12)


def test_a_layer_waits_for_its_copies_on_an_asynchronous_copy_engine() -> None:
    """llama.cpp's op offload as builds before PR #15346 made it (``op_offload_copy: all``: a prompt
    of at least ``op_offload_min_batch`` tokens copies the CPU layer's whole expert tensors and
    waits for them, ``Plan.wait_for``), from pinned memory (``mmap: false``), on the copy thread:
    the copies land before the layer ends and leave after it, as simulated."""
    ex, sim = _both("cpu-moe", {"n_cpu_moe": 1, "op_offload_min_batch": 2, "op_offload_copy": "all", "mmap": False},
                    24, copy="thread", phases=("prefill", "decode"))
    assert ex.state.policy.counts["op_offload_passes"] > 0
    real = ex.metrics()
    assert real["copy_engine"] == "thread"
    assert (real["hits"], real["late"], real["misses"]) == (sim["hits"], sim["late"], sim["misses"])
    assert real["cpu_expert_runs"] == sim["cpu_expert_runs"] > 0   # decode still runs on the host
    assert real["h2d_gb"] == pytest.approx(sim["h2d_gb"], abs=1e-12) and real["h2d_gb"] > 0


def test_op_offload_of_the_used_experts_from_pageable_memory_matches_the_simulator() -> None:
    """llama.cpp's defaults (PR #15346's used experts only; mmap, so a pageable pool and
    synchronous copies): the same hits, misses and bytes as simulated, fewer bytes than the whole
    layer's."""
    params = {"n_cpu_moe": 1, "op_offload_min_batch": 2}
    ex, sim = _both("cpu-moe", params, 24, phases=("prefill", "decode"))
    real = ex.metrics()
    assert ex.pageable and real["copy_engine"] == "sync"
    assert ex.state.policy.counts["op_offload_passes"] > 0
    assert (real["hits"], real["late"], real["misses"]) == (sim["hits"], sim["late"], sim["misses"])
    assert real["h2d_gb"] == pytest.approx(sim["h2d_gb"], abs=1e-12) and real["h2d_gb"] > 0
    _, whole = _both("cpu-moe", {**params, "op_offload_copy": "all"}, 24, phases=("prefill", "decode"))
    assert real["h2d_gb"] < whole["h2d_gb"]


def test_an_expert_run_on_the_host_adds_what_the_device_kernel_adds() -> None:
    """``Executor._cpu_experts`` (host pool, host activations) equals the device kernel on the
    same expert weights."""
    from moesim.sim.real.executor.kernels import apply_expert
    from moesim.sim.real.executor.plan import access_order, combine_weights

    ex, _ = _both("cpu-moe", {"n_cpu_moe": 1}, 16)
    om = _model()
    x = torch.randn(4, om.hidden)
    logits = torch.randn(4, 8)
    plan = np.array([[0, 3], [3, 5], [7, 0], [1, 2]])
    on_cpu = np.array([[True, False], [True, True], [False, True], [True, True]])
    w = combine_weights(logits, plan)
    exps, rows = access_order(plan, on_cpu)
    host = torch.zeros_like(x)
    ex._cpu_experts(host, ex._to_host(x, w), rows, 1, exps)
    ref = torch.zeros_like(x)
    for e in exps:
        tok, slot = rows[e]
        apply_expert(ref, x, w, tok, slot, om.host_experts[1][e].clone(), om.hidden, om.inter)
    assert torch.equal(host, ref)
    assert host[2].abs().sum() > 0 and exps == [0, 3, 5, 1, 2]


@pytest.mark.parametrize("bad", ["{a: ", "[1]", "{accelerate: 3}"])
def test_bad_policy_params_of_the_validation_table_are_one_line(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks/validate_cpu.py --policy-params`` (how the GPU run passes accelerate's
    parameters) refuses malformed YAML or a non-mapping in one line, before any model loads."""
    from benchmarks.validate_cpu import main

    with pytest.raises(SystemExit) as exc:
        main(["--policy-params", bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and "--policy-params" in err[-1] and "Traceback" not in "\n".join(err)
