"""Small hand-made traces, models and hardware on which a policy runs in a fraction of a second:
what :func:`~moesim.testing.conformance.check_policy` runs a policy on, and what the project's
own engine and policy tests build their exact cases from."""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.contract.base import Policy, Profile
from moesim.sim.config.catalog import HardwareSpec, ModelSpec, RuntimeSpec, get_hardware, get_model
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from moesim.traces.format.trace_file import (
    DECODE,
    PREFILL,
    ModelInfo,
    Trace,
    TraceMeta,
    trace_from_columns,
)

EXPERT_BYTES = 3_000_000
"""Bytes of one expert of :func:`tiny_model`."""


def tiny_model(layers: int, experts: int, top_k: int) -> ModelSpec:
    """A model whose expert is exactly 3 MB (hidden 1000 x intermediate 1000, 1-byte weights)."""
    inter = 1000
    return get_model({"name": "tiny", "num_layers": layers, "num_experts": experts, "top_k": top_k,
                      "hidden_size": 1000, "expert_intermediate_size": inter, "dtype_bytes": 1,
                      "non_expert_bytes": 0})


def tiny_hw(*, pcie_gbps: float = 3.0, latency_us: float = 0.0, layer_us: float = 100.0,
            expert_us: float = 50.0, copy_engines: int = 1, evict_us: float = 0.0,
            per_token_us: float = 0.0, d2h_gbps: float | None = None) -> HardwareSpec:
    """Hardware with calibrated costs: at 3 GB/s a 3 MB expert takes exactly 1000 us to load."""
    return get_hardware({"name": "tiny-gpu", "vram_gib": 1, "pcie_gbps": pcie_gbps, "d2h_gbps": d2h_gbps,
                         "pcie_latency_us": latency_us, "peak_tflops": 100, "hbm_gbps": 1000,
                         "copy_engines": copy_engines, "evict_us": evict_us,
                         "costs": {"layer_us": layer_us, "expert_us": expert_us,
                                   "expert_us_per_token": per_token_us}})


def make_trace(experts: list[list[list[int]]] | np.ndarray, *, num_experts: int,
               requests: list[int] | None = None, phases: list[int] | None = None,
               lookahead: np.ndarray | None = None, weights: np.ndarray | None = None,
               logits: np.ndarray | None = None) -> Trace:
    """A trace from ``experts[token][layer] = [top-k ids]``; one request unless ``requests``
    gives the request of each token (tokens of a request must be consecutive)."""
    ex = np.asarray(experts, dtype=np.int16)
    T, L, k = ex.shape
    req = np.zeros(T, dtype=np.int64) if requests is None else np.asarray(requests)
    tok = np.zeros(T, dtype=np.int64)
    for t in range(1, T):
        tok[t] = tok[t - 1] + 1 if req[t] == req[t - 1] else 0
    ph = np.full(T, DECODE) if phases is None else np.asarray(phases)
    cols: dict[str, Any] = {
        "request_id": np.repeat(req, L), "token_idx": np.repeat(tok, L), "phase": np.repeat(ph, L),
        "layer": np.tile(np.arange(L), T), "experts": ex.reshape(T * L, k),
    }
    if lookahead is not None:
        cols["lookahead_logits"] = lookahead.reshape(T * L, num_experts)
    if weights is not None:
        cols["weights"] = weights.reshape(T * L, k)
    if logits is not None:
        cols["logits"] = logits.reshape(T * L, num_experts)
    return trace_from_columns(cols, TraceMeta(ModelInfo("tiny", L, num_experts, k)))


def random_trace(seed: int, *, layers: int = 3, experts: int = 8, top_k: int = 2, requests: int = 2,
                 prompt: int = 3, decode: int = 6, locality: float = 0.6) -> Trace:
    """A random trace with some temporal locality, logits, lookahead and weights."""
    rng = np.random.default_rng(seed)
    rows_req, rows_ph, logits = [], [], []
    state = rng.normal(size=(layers, experts))
    for r in range(requests):
        for t in range(prompt + decode):
            state = locality * state + (1 - locality) * rng.normal(size=(layers, experts))
            logits.append(state.copy())
            rows_req.append(r)
            rows_ph.append(PREFILL if t < prompt else DECODE)
    lg = np.asarray(logits, dtype=np.float32)                  # [T, L, E]
    ex = np.argsort(-lg, axis=2, kind="stable")[:, :, :top_k]
    p = np.exp(lg - lg.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    w = np.take_along_axis(p, ex, axis=2).astype(np.float32)
    look = np.roll(lg, -1, axis=1)  # router of l+1 applied to l's state, approximated by l+1's logits
    return make_trace(ex, num_experts=experts, requests=rows_req, phases=rows_ph,
                      lookahead=look.astype(np.float16), weights=w)


def swap_last_tokens(tr: Trace) -> Trace:
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


def run_engine(trace: Trace, policy: Policy, model: ModelSpec, hw: HardwareSpec, *,
               budget_experts: float, buffer_experts: float = 0, batch_size: int = 1,
               phases: tuple[str, ...] = ("decode",), seed: int = 0, initial: str = "empty",
               timeline: bool = False, swap_out: bool = False, serial_swap: bool = False,
               pcie_order: str = "priority",
               sync_prefetch: bool = False, runtime: RuntimeSpec | None = None,
               profile: Profile | None = None) -> tuple[Engine, dict[str, Any]]:
    """Run ``policy`` on ``trace`` with the VRAM invariant checked after every step; the
    engine (its ``state``) and the run's metrics."""
    wl = build_workload(trace, batch_size=batch_size, phases=phases)
    cost = CostModel(model, hw) if runtime is None else CostModel(model, hw, runtime)
    eng = Engine(wl, policy, cost, budget_bytes=int(budget_experts * model.expert_bytes),
                 buffer_bytes=int(buffer_experts * model.expert_bytes), seed=seed, initial=initial,
                 swap_out=swap_out, serial_swap=serial_swap, pcie_order=pcie_order,
                 sync_prefetch=sync_prefetch, profile=profile, record_timeline=timeline, check_invariants=True,
                 fast_replay=FAST_PATH)
    eng.run()
    return eng, compute_metrics(eng.state)
