"""Counters and wall-clock times of an executor run, and its metrics with the simulator's
definitions (:mod:`moesim.sim.run.metrics`): accesses once per (iteration, layer, expert run),
``hit`` = resident when the routing became known; TTFT from the request's start to its first
output token, TPOT between consecutive output tokens; bytes counted when a copy starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.sim.engine.vram import Unit

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.real.executor.runner import Executor


@dataclass
class ExecStats:
    """Raw counters of one executor run (seconds of wall clock)."""

    hits: int = 0
    late: int = 0
    misses: int = 0
    cpu_accesses: int = 0
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    prefetch_units: int = 0
    prefetch_used: int = 0
    wasted_prefetch_bytes: int = 0
    fetch_needed: int = 0
    fetch_covered: int = 0
    evictions: int = 0
    stall_s: float = 0.0
    policy_cpu_s: float = 0.0
    wall_s: float = 0.0
    token_end: dict[int, list[float]] = field(default_factory=dict)
    request_start: dict[int, float] = field(default_factory=dict)
    iteration_s: list[float] = field(default_factory=list)

    def count_start(self, u: Unit) -> None:
        """A copy of ``u`` started: count its bytes."""
        if u.demand:
            self.demand_bytes += u.nbytes
        else:
            self.prefetch_bytes += u.nbytes
            self.prefetch_units += 1


def _dist(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    a = np.asarray(values, dtype=np.float64) * 1e3
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def exec_metrics(ex: Executor) -> dict[str, Any]:
    """The metrics of a finished run, named as the simulator names them."""
    st = ex.stats
    ttft: list[float] = []
    tpot: list[float] = []
    for r, times in st.token_end.items():
        ttft.append(times[0] - st.request_start.get(r, 0.0))
        tpot.extend(np.diff(times).tolist())
    accesses = st.hits + st.late + st.misses
    outputs = sum(len(v) for v in st.token_end.values())
    tokens = sum(it.n_tokens for it in ex.workload.iterations)
    fetched = st.demand_bytes + st.prefetch_bytes
    return {
        "policy": ex.policy.name,
        "bound": bool(ex.policy.oracle),
        "iterations": len(ex.workload.iterations),
        "tokens": tokens,
        "output_tokens": outputs,
        "wall_s": st.wall_s,
        "ttft_ms": _dist(ttft),
        "tpot_ms": _dist(tpot),
        "tokens_per_s": outputs / st.wall_s if st.wall_s > 0 else 0.0,
        "accesses": accesses,
        "hits": st.hits,
        "late": st.late,
        "misses": st.misses,
        "hit_rate": st.hits / accesses if accesses else 0.0,
        "late_rate": st.late / accesses if accesses else 0.0,
        "miss_rate": st.misses / accesses if accesses else 0.0,
        "stall_ms": st.stall_s * 1e3,
        "h2d_gb": fetched / 1e9,
        "h2d_gb_per_token": fetched / 1e9 / tokens if tokens else 0.0,
        "demand_gb": st.demand_bytes / 1e9,
        "prefetch_gb": st.prefetch_bytes / 1e9,
        "wasted_prefetch_gb": st.wasted_prefetch_bytes / 1e9,
        "fetch_precision": st.prefetch_used / st.prefetch_units if st.prefetch_units else None,
        "prefetch_recall": st.fetch_covered / st.fetch_needed if st.fetch_needed else None,
        "evictions": st.evictions,
        "cpu_expert_runs": st.cpu_accesses,
        "copy_busy_ms": ex.copier.busy_s() * 1e3,
        "policy_cpu_ms": st.policy_cpu_s * 1e3,
        "device": str(ex.om.device),
        "copy_engine": ex.copier.name,
        "warnings": list(ex.ctx.warnings),
    }
