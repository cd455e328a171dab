"""Every registered policy: builds with its defaults, keeps VRAM within the budget, is
deterministic, and (unless it is an oracle) never reads the future."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from moesim.policies.contract.registry import (
    PolicyError,
    make_policy,
    policy_class,
    policy_names,
    policy_params,
)
from moesim.traces.format.trace_file import Trace
from tests.util import make_trace, random_trace, run_engine, steps, tiny_hw, tiny_model

NAMES = policy_names()


def _steps(engine) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [tuple(s) for s in steps(engine)]


def _swap_last_tokens(tr: Trace) -> Trace:
    """The same trace with the last two tokens' routing swapped: per-layer expert frequencies
    (any offline profile) stay the same, the future differs."""
    L, E = tr.model.num_layers, tr.model.num_experts
    T = tr.num_rows // L
    order = np.arange(T)
    order[[T - 2, T - 1]] = order[[T - 1, T - 2]]

    def per_token(a: np.ndarray) -> np.ndarray:
        return a.reshape(T, L, -1)[order]

    assert tr.lookahead_logits is not None and tr.weights is not None
    return make_trace(per_token(tr.experts), num_experts=E,
                      requests=tr.request_id[::L].tolist(), phases=tr.phase[::L].tolist(),
                      lookahead=per_token(tr.lookahead_logits), weights=per_token(tr.weights))


@pytest.mark.parametrize("name", NAMES)
def test_builds_with_defaults_and_lists_its_params(name: str) -> None:
    cls = policy_class(name)
    pol = make_policy(name)
    assert pol.name == name
    assert cls.summary, f"{name} has no summary for `simctl policies`"
    # scikit-learn style: the parameters are the __init__ keywords (explicit, no *args or
    # **kwargs), stored as given: defaults as declared, and a changed value as passed
    sig = inspect.signature(cls.__init__)
    kinds = {p.kind for p in list(sig.parameters.values())[1:]}
    assert kinds <= {inspect.Parameter.KEYWORD_ONLY}, f"{name}: __init__ takes {kinds}"
    assert pol.get_params() == policy_params(cls)
    for key, default in policy_params(cls).items():
        value = _changed(default)
        if value is None:
            continue
        try:
            changed = make_policy(name, {key: value})
        except PolicyError:   # outside the parameter's range: nothing to compare
            continue
        assert changed.get_params()[key] == value, f"{name}.{key} not stored as given"


def _changed(default: object) -> object:
    """A value of ``default``'s type that differs from it (None: no such value to try)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 0.5 if default else 0.5
    if isinstance(default, str):
        return None   # a choice: other strings may be invalid names
    return None


# copy-queue disciplines every policy must survive: priority (default), one fifo stream, and
# synchronous prefetch (the GPU waits for every issued prefetch before each layer)
QUEUES = [("priority", False), ("fifo", False), ("priority", True), ("fifo", True)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch,budget,buffer", [(1, 12, 0), (2, 6, 2), (3, 9, 0)])
@pytest.mark.parametrize("swap_out", [False, True])
@pytest.mark.parametrize("order,sync", QUEUES)
def test_vram_stays_within_budget(name: str, batch: int, budget: int, buffer: int, swap_out: bool,
                                  order: str, sync: bool) -> None:
    tr = random_trace(1, layers=3, experts=8, top_k=2, requests=3)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    eng, m = run_engine(tr, make_policy(name), model, hw, budget_experts=budget, buffer_experts=buffer,
                        batch_size=batch, phases=("prefill", "decode"), swap_out=swap_out,
                        pcie_order=order, sync_prefetch=sync)
    assert eng.state.stats.vram_peak_bytes <= (budget + buffer) * model.expert_bytes
    assert m["hits"] + m["late"] + m["partial"] + m["misses"] == m["accesses"]
    assert m["accesses"] + m["cpu_expert_runs"] > 0   # experts ran (cpu-moe may run all on the CPU)
    assert all(used >= 0 for used in eng.state.vram.used)
    assert all(d >= 0 for d in eng.state.vram.draining) and eng.state.vram.buffer_draining >= 0
    if policy_class(name).lossy:
        assert 0 < m["routing_mass_kept"] <= 1 and m["effective_top_k"] > 0
    if swap_out:   # only what was loaded can be copied back (the last copies may still be in flight)
        assert m["d2h_gb"] <= m["h2d_gb"] + 1e-12
        assert m["d2h_gb"] > 0 or m["evictions"] == 0
    else:
        assert m["d2h_gb"] == 0
    assert 0.0 <= m["gpu_busy_fraction"] <= 1.0 + 1e-9


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("swap_out", [False, True])
@pytest.mark.parametrize("order,sync", [("priority", False), ("fifo", True)])
def test_same_seed_same_output(name: str, swap_out: bool, order: str, sync: bool) -> None:
    tr = random_trace(2, requests=2)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    runs = [run_engine(tr, make_policy(name), model, hw, budget_experts=9, seed=7, initial="random",
                       swap_out=swap_out, pcie_order=order, sync_prefetch=sync)
            for _ in range(2)]
    assert runs[0][1] == runs[1][1]
    assert _steps(runs[0][0]) == _steps(runs[1][0])


@pytest.mark.parametrize("name", [n for n in NAMES if not policy_class(n).oracle])
@pytest.mark.parametrize("order,sync,swap_out", [("priority", False, False), ("fifo", True, True)])
def test_never_reads_the_future(name: str, order: str, sync: bool, swap_out: bool) -> None:
    tr_a = random_trace(3, requests=2, decode=8)
    tr_b = _swap_last_tokens(tr_a)
    assert not np.array_equal(tr_a.experts, tr_b.experts)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    kw = {"pcie_order": order, "sync_prefetch": sync, "swap_out": swap_out}
    eng_a, _ = run_engine(tr_a, make_policy(name), model, hw, budget_experts=9, **kw)  # type: ignore[arg-type]
    eng_b, _ = run_engine(tr_b, make_policy(name), model, hw, budget_experts=9, **kw)  # type: ignore[arg-type]
    n_iters = len(eng_a.state.workload.iterations)
    # everything up to the first swapped token (the second-to-last iteration) is identical
    prefix = [s for s in _steps(eng_a) if s[0] < n_iters - 2]
    assert prefix and prefix == [s for s in _steps(eng_b) if s[0] < n_iters - 2]


def test_oracles_are_labelled_as_bounds() -> None:
    oracles = {n for n in NAMES if policy_class(n).oracle}
    assert {"belady", "oracle-prefetch"} <= oracles
    tr = random_trace(4)
    _, m = run_engine(tr, make_policy("belady"), tiny_model(3, 8, 2), tiny_hw(), budget_experts=6)
    assert m["bound"] is True
