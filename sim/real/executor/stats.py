"""Counters and wall-clock times of an executor run, and its metrics with the simulator's
definitions (:mod:`moesim.sim.run.metrics`): accesses once per (iteration, layer, expert run),
``hit`` = resident when the routing became known; TTFT from the request's start to its first
output token, TPOT between consecutive output tokens; bytes counted when a copy starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moesim.sim.engine.records import RunStats
from moesim.sim.engine.state import RunState
from moesim.sim.engine.vram import Unit


@dataclass
class ExecStats(RunStats):
    """Raw counters of one executor run (seconds of wall clock): the simulator's counters (those
    the executor measures), the run's wall time and each timed iteration's."""

    wall_s: float = 0.0
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


def exec_metrics(run: RunState[Any], st: ExecStats, *, copy_busy_s: float, copy_engine: str,
                 device: str) -> dict[str, Any]:
    """The metrics of a finished run (its state, counters and copy engine), named as the
    simulator names them."""
    ttft: list[float] = []
    tpot: list[float] = []
    for r, times in st.token_end.items():
        ttft.append(times[0] - st.request_start.get(r, 0.0))
        tpot.extend(np.diff(times).tolist())
    accesses = st.hits + st.late + st.misses
    outputs = sum(len(v) for v in st.token_end.values())
    tokens = sum(it.n_tokens for it in run.workload.iterations)
    fetched = st.demand_bytes + st.prefetch_bytes
    return {
        "policy": run.policy.name,
        "bound": bool(run.policy.oracle),
        "iterations": len(run.workload.iterations),
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
        "copy_busy_ms": copy_busy_s * 1e3,
        "policy_cpu_ms": st.policy_cpu_s * 1e3,
        "device": device,
        "copy_engine": copy_engine,
        "warnings": list(run.ctx.warnings),
    }
