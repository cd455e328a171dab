"""The workload of a serving run (``workload.arrivals``): the requests the scenario selects,
replayed by requests that arrive over time (:mod:`moesim.sim.engine.serving` maps them to the
trace), as a :class:`~moesim.sim.engine.workload.Workload` whose ``serving`` plan each run
schedules itself (:mod:`moesim.sim.engine.scheduler`)."""

from __future__ import annotations

from collections.abc import Sequence

from moesim.sim.engine.arrivals import Arrivals
from moesim.sim.engine.scheduler import Scheduler
from moesim.sim.engine.serving import build_plan
from moesim.sim.engine.workload import Workload
from moesim.traces.format.trace_file import Trace


def serving_workload(trace: Trace, chosen: Sequence[int], phases: Sequence[str], arrivals: Arrivals, *,
                     kind: str, max_batch: int, max_tokens: int, context_tokens: int,
                     kv_modelled: bool) -> Workload:
    """The serving workload of ``arrivals`` over the trace requests ``chosen``. Its
    ``iterations`` hold only the first iteration (what an idle GPU runs at the first arrival:
    the run's own scheduler forms the same one and the rest as the GPU frees); ``requests`` are
    the served requests' numbers; ``kv_modelled`` whether the requests' KV cache is read and held
    (the model gives an attention shape; the starting context may be 0); ``peak_kv_tokens`` the bound of
    :meth:`~moesim.sim.engine.serving.ServingPlan.peak_kv_tokens`; the replayed token rows are
    every served token's (for offline frequencies)."""
    plan = build_plan(trace, chosen, phases, arrivals, kind=kind, max_batch=max_batch, max_tokens=max_tokens,
                      context_tokens=context_tokens, kv_modelled=kv_modelled)
    first = Scheduler(plan).next_iteration(0.0)
    assert first is not None   # a plan has at least one request with a token
    rows = plan.all_rows()
    rows.flags.writeable = False
    wl = Workload(trace=trace, iterations=[first], batches=0, requests=list(range(plan.n)),
                  decode_tokens=sum(len(x) for x in plan.decode_rows), context_tokens=context_tokens,
                  peak_kv_tokens=plan.peak_kv_tokens(), serving=plan)
    wl._token_rows = rows
    return wl
