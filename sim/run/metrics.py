"""Metric definitions (docs/contract.md, "Metrics"), computed once from a finished run.

Accesses count once per (iteration, layer, expert executed): ``hit`` = every part resident
when the routing became known, ``late`` = issued but not all landed, ``partial`` = some part
resident and some absent (segments, MoEpic), ``miss`` = absent. ``hit_rate`` counts full hits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.sim.config.catalog import GIB

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState


def percentile(ordered: np.ndarray, p: int) -> float:
    """``np.percentile(values, p)`` (its default, linear method) from ``values`` sorted
    (``ordered``, float64, not empty), bit for bit: the same operations on the same doubles.
    numpy's own quantile code imports numpy.ma on its first call (about 8 ms of every run)."""
    n = len(ordered)
    if math.isnan(ordered[-1]):   # numpy: any NaN makes the percentile NaN (sorted last)
        return math.nan
    index = (n - 1) * (p / 100)    # numpy: (n - 1) * true_divide(p, 100)
    if index >= n - 1:
        # numpy interpolates at the top end too: both neighbours are the last value, at index
        # -1, so its weight is index + 1 (an inf alone becomes NaN, as inf - inf)
        a = b = float(ordered[-1])
        t = index + 1
    else:
        below = math.floor(index)
        a, b = float(ordered[below]), float(ordered[below + 1])
        t = index - below
    diff = b - a                   # numpy's _lerp: from the nearer end
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _dist(values: list[float], scale: float) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    a = np.asarray(values, dtype=np.float64) * scale
    ordered = np.sort(a)
    return {"mean": float(a.mean()), "p50": percentile(ordered, 50), "p99": percentile(ordered, 99)}


def cache_start(initial: str) -> str:
    """``cold`` or ``warm``: how the run's expert cache starts (``cache.initial``). ``cold``
    (``empty``): only what the policy's system loads with the model (its resident layers, its
    pinned experts) is on the GPU before the first token, as a freshly started server; ``warm``
    (``popular``, ``random``): the cache is full before the first token, as a server that has run
    before. Published tables differ in it (a benchmark that discards warm-up tokens measures a
    warm cache), so every result states it."""
    return "cold" if initial == "empty" else "warm"


def compute_metrics(run: RunState[Any]) -> dict[str, Any]:
    """All reported metrics of a finished run (its :class:`~moesim.sim.engine.state.RunState`:
    the event loop's or a fast replay's), as plain data."""
    st = run.stats
    wl = run.workload
    model = run.cost.model
    policy = run.policy
    sim_time = run.now()
    ttft: list[float] = []
    tpot: list[float] = []
    for r, times in st.token_end.items():
        start = st.request_start.get(r, 0.0)
        ttft.append(times[0] - start)
        tpot.extend(np.diff(times).tolist())
    sched = run.scheduler   # serving: the iterations its scheduler formed (the workload holds the first)
    tokens = sum(it.n_tokens for it in wl.iterations) if sched is None else sched.tokens
    outputs = sum(len(v) for v in st.token_end.values())
    accesses = st.hits + st.late + st.partial + st.misses
    fetched = st.demand_bytes + st.prefetch_bytes

    def rate(x: int) -> float:
        return x / accesses if accesses else 0.0

    per_out = 1.0 / outputs if outputs else 0.0
    per_tok = 1.0 / tokens if tokens else 0.0
    out: dict[str, Any] = {
        "policy": policy.name,
        "bound": bool(policy.oracle),
        "iterations": len(wl.iterations) if sched is None else sched.count,
        "tokens": tokens,
        "output_tokens": outputs,
        "requests": len(wl.requests),
        "sim_time_s": sim_time,
        "ttft_ms": _dist(ttft, 1e3),
        "tpot_ms": _dist(tpot, 1e3),
        "tokens_per_s": outputs / sim_time if sim_time > 0 else 0.0,
        "accesses": accesses,
        "hits": st.hits,
        "late": st.late,
        "partial": st.partial,
        "misses": st.misses,
        "hit_rate": rate(st.hits),
        "late_rate": rate(st.late),
        "partial_rate": rate(st.partial),
        "miss_rate": rate(st.misses),
        "stall_ms": st.stall_s * 1e3,
        "stall_ms_per_token": st.stall_s * 1e3 * per_out,
        "blocking_io_ms": st.stall_s * 1e3,
        "blocking_io_ms_per_token": st.stall_s * 1e3 * per_out,
        "sync_prefetch_stall_ms": st.sync_stall_s * 1e3,
        "pcie_busy_ms": st.pcie_busy_s * 1e3,
        "d2h_gb": st.d2h_bytes / 1e9,
        "d2h_gb_per_token": st.d2h_bytes / 1e9 * per_tok,
        "d2h_busy_ms": st.d2h_busy_s * 1e3,
        "io_busy_ms": (st.pcie_busy_s + st.d2h_busy_s) * 1e3,
        "io_busy_ms_per_token": (st.pcie_busy_s + st.d2h_busy_s) * 1e3 * per_out,
        "h2d_gb": fetched / 1e9,
        "h2d_gb_per_token": fetched / 1e9 * per_tok,
        "demand_gb": st.demand_bytes / 1e9,
        "prefetch_gb": st.prefetch_bytes / 1e9,
        "wasted_prefetch_gb": st.wasted_prefetch_bytes / 1e9,
        "refetch_gb": st.refetch_bytes / 1e9,
        "fetch_precision": st.prefetch_used / st.prefetch_units if st.prefetch_units else None,
        "prefetch_recall": st.fetch_covered / st.fetch_needed if st.fetch_needed else None,
        "evictions": st.evictions,
        "cpu_expert_runs": st.cpu_accesses,
        "cpu_busy_ms": st.cpu_busy_s * 1e3,
        "cpu_wait_ms": st.cpu_wait_s * 1e3,
        "runtime_overhead_ms": st.overhead_s * 1e3,
        "policy_cpu_ms": st.policy_cpu_s * 1e3,
        "expert_vram_peak_gib": st.vram_peak_bytes / GIB,
        "vram_peak_gib": (st.vram_peak_bytes + model.non_expert_bytes) / GIB,
        "expert_budget_gib": sum(run.ctx.pool_capacity) / GIB,
        "gpu_busy_fraction": st.gpu_busy_s / sim_time if sim_time > 0 else 0.0,
        "cache_start": cache_start(run.initial),
        "warnings": list(run.warnings),
        "engine_path": run.path,
        "engine_path_reason": run.path_reason,   # why no fast replay ran ("" when one did)
    }
    if st.aborted_prefetches:   # only runs whose policy aborted copies in flight (MoEpic)
        out["aborted_prefetches"] = st.aborted_prefetches
        out["aborted_prefetch_gb"] = st.aborted_bytes / 1e9
    report = policy.report()
    if report:
        out["policy_report"] = report
    if policy.lossy:
        tl = st.token_layers
        out.update({
            "substitutions_per_token": st.substitutions * per_out,
            "dropped_per_token": st.dropped * per_out,
            "routing_mass_kept": st.mass_kept_sum / tl if tl else 1.0,
            "top1_agreement": st.top1_kept / tl if tl else 1.0,
            "effective_top_k": st.slots_run / tl if tl else float(run.K),
            "lossy_token_layers": st.lossy_layers / tl if tl else 0.0,
            "routing_mass_weighted": "weights" in run.ctx.columns,
            "note": "lossy policy: later routing is replayed as recorded; the quality effect is not simulated",
        })
    return out
