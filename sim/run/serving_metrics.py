"""The serving metrics of a run with arrivals (docs/contract.md, "Serving"), from its
scheduler's per-request times: arrival, admission, first token, finish.

Per request: ``ttft`` = first token - arrival; ``queue`` = admission (its first iteration's
start) - arrival; ``e2e`` = finish - arrival; ``tpot`` = (finish - first token) / (output
tokens - 1), for requests with at least two output tokens. Each is given as mean, p50, p90 and
p99 over requests (numpy's linear percentile) in milliseconds. Throughput: finished requests and
output tokens per second of simulated time (from 0 to the last token). Goodput: requests per
second that met every SLO target given (``slo.ttft_ms``, ``slo.tpot_ms``; a request with one
output token has no TPOT and meets that target), and their fraction (``slo_attainment``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.sim.config.serving_spec import SloSpec
from moesim.sim.engine.scheduler import Scheduler
from moesim.sim.run.metrics import percentile


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """Mean, p50, p90 and p99 of ``values`` (None each when empty)."""
    if not len(values):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return {"mean": float(ordered.mean()), "p50": percentile(ordered, 50), "p90": percentile(ordered, 90),
            "p99": percentile(ordered, 99)}


def serving_metrics(sched: Scheduler, sim_time: float, slo: SloSpec | None) -> dict[str, Any]:
    """The ``serving`` block of ``metrics.json`` for a run whose scheduler is ``sched``, that ran
    ``sim_time`` seconds, under ``slo`` (None: no goodput)."""
    plan = sched.plan
    arrival = plan.arrival
    done = ~np.isnan(sched.finish)
    ttft = (sched.first_token - arrival)[done]
    queue = (sched.admitted - arrival)[done]
    e2e = (sched.finish - arrival)[done]
    n_out = sched.tokens_out[done]
    multi = n_out > 1
    tpot_all = np.full(len(n_out), np.nan)
    tpot_all[multi] = (sched.finish[done][multi] - sched.first_token[done][multi]) / (n_out[multi] - 1)
    finished = int(done.sum())
    out: dict[str, Any] = {
        "scheduler": plan.kind,
        "max_batch": plan.max_batch,
        "max_tokens": plan.max_tokens if plan.kind == "continuous" else None,
        "requests": plan.n,
        "finished": finished,
        "offered_rps": (plan.n - 1) / float(arrival[-1]) if plan.n > 1 and arrival[-1] > 0 else None,
        "ttft_ms": distribution(ttft * 1e3),
        "tpot_ms": distribution(tpot_all[multi] * 1e3),
        "e2e_ms": distribution(e2e * 1e3),
        "queue_ms": distribution(queue * 1e3),
        "requests_per_s": finished / sim_time if sim_time > 0 else 0.0,
        "output_tokens_per_s": int(n_out.sum()) / sim_time if sim_time > 0 else 0.0,
        "iterations": sched.count,
        "tokens": sched.tokens,
    }
    if plan.kv_modelled:
        out["kv_live_peak_tokens"] = sched.live_kv_peak
    if slo is not None:
        ok = np.ones(finished, dtype=bool)
        if slo.ttft_ms is not None:
            ok &= ttft * 1e3 <= slo.ttft_ms
        if slo.tpot_ms is not None:
            ok &= ~multi | (np.nan_to_num(tpot_all, nan=0.0) * 1e3 <= slo.tpot_ms)
        good = int(ok.sum())
        out["slo"] = slo.model_dump(exclude_none=True)
        out["slo_met"] = good
        out["slo_attainment"] = good / plan.n if plan.n else 0.0
        out["goodput_rps"] = good / sim_time if sim_time > 0 else 0.0
    return out
