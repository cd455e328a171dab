"""The speed-up a run's summary leads with: the same scenario under ``lru`` and ``no-cache``.

How it stays cheap: both baselines are demand-only policies, so they replay on the fast path
(:mod:`moesim.sim.fast`, no SimPy) on the trace the run already holds in memory (no second
read, no second synthesis), without step records or a timeline. ``lru`` has a kernel of its
own (a few milliseconds for the bundled FLAME sample); ``no-cache``, and any baseline the
scenario sends to the event loop (a transfer buffer, swap-out, synchronous prefetch, pools
smaller than one layer's experts), replays access by access, so it runs only while the
workload is small (:data:`GENERIC_LIMIT` and :data:`EVENT_LOOP_LIMIT` expert accesses: about
half a second of CPU); past that the summary says it was skipped and how to run it
(``--set policy=no-cache``). Nothing here runs in sweeps, ``--json`` or ``metrics.json``: only
the one-screen summary of ``simctl run`` shows the figures (``--no-baselines`` turns them off).
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.sim.config.scenario import LoadedScenario, PolicySpec
from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.state import RunState
from moesim.sim.engine.transfers import Transfers
from moesim.sim.engine.workload import Workload
from moesim.sim.fast.kernel_choice import ordered_kind
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.runner import RunResult, prepare_run
from moesim.traces.format.trace_file import Trace

BASELINES = ("lru", "no-cache")
"""The policies a run is compared with: the usual demand cache, and no cache at all."""

GENERIC_LIMIT = 120_000
"""Most expert accesses (tokens x MoE layers x top_k) a baseline replays on the fast path
without a kernel of its own (``no-cache``: about 0.5 s of CPU at the limit)."""

EVENT_LOOP_LIMIT = 30_000
"""Most expert accesses a baseline replays on the event loop."""


class _Skipped(Exception):
    """A baseline that would not be cheap: the reason."""


class _CheapOnly:
    """The fast replay, within the limits above; a baseline past them raises :class:`_Skipped`."""

    def refusal(self, run: RunState[Transfers]) -> str | None:
        """Why the run takes the event loop (as the fast replay says), or None; raises
        :class:`_Skipped` past the limits."""
        why = FAST_PATH.refusal(run)
        if why is None and ordered_kind(run) is not None:
            return None                     # a kernel: cheap at any size
        accesses = len(run.workload.token_rows()) * run.L * run.K
        limit = GENERIC_LIMIT if why is None else EVENT_LOOP_LIMIT
        if accesses > limit:
            how = "without a fast kernel" if why is None else f"on the event loop ({why})"
            raise _Skipped(f"{accesses:,} expert accesses {how}")
        return why

    def run(self, run: RunState[Transfers]) -> None:
        """The fast replay of ``run``."""
        FAST_PATH.run(run)


@dataclass(frozen=True)
class Speedup:
    """This run against one baseline: ``speedup`` is the baseline's mean TPOT over the run's
    (the simulated total time where the workload has no decode step), or None with ``reason``."""

    baseline: str
    speedup: float | None
    metric: str = "TPOT"
    reason: str = ""


def _time_of(metrics: dict[str, object]) -> tuple[str, float | None]:
    tpot = metrics.get("tpot_ms")
    mean = tpot.get("mean") if isinstance(tpot, dict) else None
    if isinstance(mean, (int, float)) and mean > 0:
        return "TPOT", float(mean)
    total = metrics.get("sim_time_s")
    return "simulated time", float(total) if isinstance(total, (int, float)) and total > 0 else None


def speedups(loaded: LoadedScenario, result: RunResult, trace: Trace,
             workload: Workload | None = None) -> list[Speedup]:
    """The run's speed-up over each baseline other than its own policy (see the module);
    ``workload``, the run's own, is replayed again rather than built again."""
    own = result.metrics["policy"]
    metric, mine = _time_of(result.metrics)
    out: list[Speedup] = []
    for name in BASELINES:
        if name == own:
            continue
        scen = loaded.scenario.model_copy(update={"policy": PolicySpec(name=name)})
        other = loaded.model_copy(update={"scenario": scen})
        try:
            prep = prepare_run(other, steps=False, trace=trace, workload=workload)
            prep.engine.fast_replay = _CheapOnly()
            base = prep.run()
        except _Skipped as exc:
            out.append(Speedup(name, None, metric, f"not run: {exc}; --set policy={name} runs it"))
            continue
        except MoesimError as exc:
            out.append(Speedup(name, None, metric, f"{name} cannot run here: {exc}"))
            continue
        _, theirs = _time_of(base.metrics)
        ratio = theirs / mine if theirs is not None and mine else None
        out.append(Speedup(name, ratio, metric, "" if ratio is not None else "no time to compare"))
    return out
