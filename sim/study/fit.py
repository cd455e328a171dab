"""``simctl fit``: fit declared scenario values to measured end-to-end results by running the
simulator, then judge the fit on rows it never saw.

The residual of a measurement is ``log(predicted / measured)``; the fit minimises their sum of
squares over the fit rows (:func:`fit_measurements`) in three steps:

1. **Coarse start.** Every fit row runs at each point of a small grid over the bounds, evenly
   spaced in log space (cell midpoints; 5 points a key for one or two keys, fewer for more).
   All groups of a key share the grid value, but the start takes for each group the grid
   value that suits its own rows best (the rows of one group depend only on the values for all
   rows and their group's). A rough surface cannot trap the refinement in a far valley.
2. **Refinement.** ``scipy.optimize.least_squares`` (trust-region reflective, bounded) in the
   unit cube that maps each value's log range onto [0, 1], from that start, then a Nelder-Mead
   polish from its point (kept only where it lowers the sum of squares). Values that no row
   shares (two values per hardware and no value for all rows: one group per hardware) are
   refined group by group, each on its own rows: the same optimum, at a fraction of the runs.
3. **Judgement.** Leave-one-out over the fit rows, and the held-out (``role: test``) rows, which
   run only once, at the final values.

Why a polish after least squares: the simulator is deterministic, and a change of a time or a
bandwidth moves a run smoothly until an event changes order (a prefetch lands after the layer
that wanted it instead of before), where the objective steps. On 32 decode tokens of Mixtral
with ``mixtral-offloading`` the TPOT is a sawtooth in ``hardware.pcie_gbps``, with steps of
about 3% every 2-3% of bandwidth (``lru`` and ``no-cache`` are smooth: their loads do not
depend on timing). The Jacobian here is a forward difference with a step of ``diff_step``
(default 3%) of each value, computed for all values in one batch of runs (a value fitted per
hardware reruns only that hardware's rows): large enough to measure the trend through a tooth
rather than a step's cliff, and cheap. But least squares' trust region shrinks on such a
surface until it stops in a tooth's basin: in ``benchmarks/bench_fit.py`` (seed 0) it stopped
at a sum of squares of 0.0152 over 12 rows, where Nelder-Mead, whose first simplex (half a grid
cell) spans many teeth, went on to 0.0070 (two GPUs of four moved; on two other seeds it
moved one GPU of four or none). The polish costs about as many runs again as least squares.

Leave-one-out: by default (``loo="refit"``) each fit row is left out in turn, the fit refined
again without it from the full fit's values (only the values of the row's independent group
move, on that group's other rows), and the simulator runs the left-out row at the refitted
values. ``loo="one-step"`` replaces the refit by one Gauss-Newton step with the full fit's
Jacobian (one run per row): cheap, but a linearisation, far off where leaving a row out leaves
a group barely determined (a 6.9x error on a row that the refit predicted within 1.15x in
``benchmarks/bench_fit.py``). A row whose group has no other fit row has no leave-one-out
prediction (``n/a``).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from moesim.sim.config.fitted import ErrorSummary
from moesim.sim.study.fit_runs import RowRunner, Values
from moesim.sim.study.fit_spec import FreeValue, Measurements, Row, value_groups

LooMethod = Literal["one-step", "refit", "none"]


@dataclass(frozen=True)
class Measure:
    """One measured number: a row and one of its metrics."""

    row: Row
    metric: str
    measured: float


NM_SIMPLEX = 0.1
"""Size of the Nelder-Mead polish's first simplex, in the unit cube (half a cell of a 5-point grid)."""
NM_XATOL = 0.005
"""The polish stops when its simplex is this small in the unit cube (about 2% of a value whose
bounds span a factor 100: the width of a sawtooth's tooth, finer than which a value means
nothing) and its sums of squares agree within :data:`NM_FATOL`."""
NM_FATOL = 1e-4
"""Sums of squared log errors this close are one: a 1% error on one row is 1e-4."""


@dataclass
class Refined:
    """What one refinement took: least-squares evaluations and Jacobians, Nelder-Mead
    evaluations, the sum of squared log errors after each, and whether the polish moved."""

    ls_evals: int
    ls_jacobians: int
    nm_evals: int
    ls_sse: float
    sse: float
    polish_moved: bool


@dataclass
class FittedValue:
    """A free value after the fit."""

    free: FreeValue
    value: float
    start: float
    at_bound: str | None
    rel_std: float | None
    fit_rows: list[str]
    held_out: ErrorSummary | None = None
    """The error over the held-out rows that this value applies to (None: there are none)."""


@dataclass
class FitResult:
    """Everything ``simctl fit`` reports and writes."""

    ms: Measurements
    values: list[FittedValue]
    measures: list[Measure]
    predicted: list[float]
    loo_predicted: list[float | None]
    fit_error: ErrorSummary
    loo_error: ErrorSummary | None
    held_out: ErrorSummary | None
    loo_method: str
    optimizer: dict[str, Any]
    runs: int
    engine_paths: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def summarise(ratios: list[float]) -> ErrorSummary:
    """Median |error|, largest ratio either way, and how many within 1.5x. An infinite ratio
    (a held-out ratio row whose reference the simulator puts at zero: no prediction) is a
    miss, never dropped: infinitely far, not within 1.5x."""
    if not ratios:
        return ErrorSummary(rows=0, median_abs_error_pct=None, max_ratio=None, within_1_5x=0)
    r = np.asarray(ratios, dtype=float)
    with np.errstate(divide="ignore"):
        off = np.where(np.isfinite(r), np.maximum(r, 1 / r), np.inf)
    err = np.where(np.isfinite(r), np.abs(r - 1), np.inf)
    return ErrorSummary(rows=len(r), median_abs_error_pct=round(float(np.median(err)) * 100, 3),
                        max_ratio=round(float(np.max(off)), 4),
                        within_1_5x=int(np.sum(np.isfinite(r) & (r <= 1.5) & (r >= 1 / 1.5))))


def _sig(x: float) -> float:
    """A value to 10 significant digits: what runs is what ``fitted.yaml`` writes."""
    return float(f"{x:.10g}")


class Problem:
    """The fit as a function of ``u`` in the unit cube: one coordinate per free value, its log
    range mapped onto [0, 1]."""

    def __init__(self, ms: Measurements, runner: RowRunner, diff_step: float) -> None:
        self.ms, self.runner, self.free, self.diff_step = ms, runner, ms.free, diff_step
        self.lo = np.log([f.lo for f in self.free])
        self.span = np.log([f.hi for f in self.free]) - self.lo
        self.step = np.log1p(diff_step) / self.span
        self.measures = [Measure(r, k, v) for r in ms.rows for k, v in r.measured.items()]
        self.affects = [[f.applies_to(m.row) for m in self.measures] for f in self.free]

    def theta(self, u: np.ndarray) -> list[float]:
        """The values at ``u``."""
        return [_sig(math.exp(a + x * s)) for a, x, s in zip(self.lo, np.clip(u, 0, 1), self.span, strict=True)]

    def u_of(self, values: list[float]) -> np.ndarray:
        """The inverse of :meth:`theta`."""
        return np.clip((np.log(values) - self.lo) / self.span, 0, 1)

    def row_values(self, row: Row, theta: list[float]) -> Values:
        """The fitted values a row runs with."""
        return tuple((f.key, theta[j]) for j, f in enumerate(self.free) if f.applies_to(row))

    def predicted(self, m: Measure, theta: list[float]) -> float:
        """The simulator's value of a measure at ``theta`` (after its run)."""
        value = self.runner.outcome(m.row.index, self.row_values(m.row, theta)).values[m.metric]
        assert value is not None   # RowRunner refuses null metrics
        return value

    def residuals_many(self, points: list[tuple[np.ndarray, list[int]]]) -> list[np.ndarray]:
        """For each (u, measure indices): the log ratios, all runs of all points in one batch."""
        plans = []
        for u, idx in points:
            th = self.theta(u)
            plans.append([(self.measures[i].row.index, self.row_values(self.measures[i].row, th)) for i in idx])
        self.runner.run([t for plan in plans for t in plan])
        out = []
        for (_, idx), plan in zip(points, plans, strict=True):
            pred = [self.runner.outcome(*t).values[self.measures[i].metric] for i, t in zip(idx, plan, strict=True)]
            meas = [self.measures[i].measured for i in idx]
            out.append(np.log(np.maximum(np.asarray(pred, dtype=float), 1e-6 * np.asarray(meas))) - np.log(meas))
        return out

    def tasks(self, points: list[tuple[np.ndarray, list[int]]]) -> list[tuple[int, Values]]:
        """The runs that :meth:`residuals_many` of ``points`` needs."""
        out = []
        for u, idx in points:
            th = self.theta(u)
            out += [(self.measures[i].row.index, self.row_values(self.measures[i].row, th)) for i in idx]
        return out

    def residuals(self, u: np.ndarray, idx: list[int]) -> np.ndarray:
        """The log ratios of the measures ``idx`` at ``u``."""
        return self.residuals_many([(u, idx)])[0]

    def jacobian_points(self, u: np.ndarray, idx: list[int], active: list[int] | None = None
                        ) -> tuple[list[tuple[np.ndarray, list[int]]], list[tuple[int, float, list[int]]]]:
        """The points :meth:`jacobian` runs (``u`` first) and, per column, (value, step, rows)."""
        points: list[tuple[np.ndarray, list[int]]] = [(u, idx)]
        cols: list[tuple[int, float, list[int]]] = []
        for j in range(len(self.free)) if active is None else active:
            rows = [k for k, i in enumerate(idx) if self.affects[j][i]]
            if not rows:
                continue
            h = self.step[j] if u[j] + self.step[j] <= 1 else -self.step[j]
            v = u.copy()
            v[j] += h
            points.append((v, [idx[k] for k in rows]))
            cols.append((j, h, rows))
        return points, cols

    def jacobian(self, u: np.ndarray, idx: list[int], active: list[int] | None = None) -> np.ndarray:
        """Forward differences of :meth:`residuals` with a step of ``diff_step`` of each value
        (backwards at the upper bound), every column (of the values ``active``; all by default)
        in one batch of runs."""
        points, cols = self.jacobian_points(u, idx, active)
        res = self.residuals_many(points)
        jac = np.zeros((len(idx), len(self.free)))
        for (j, h, rows), r in zip(cols, res[1:], strict=True):
            jac[rows, j] = (r - res[0][rows]) / h
        return jac

    def solve(self, u0: np.ndarray, idx: list[int], active: list[int], max_evals: int) -> tuple[np.ndarray, Refined]:
        """Refine the values ``active`` over the measures ``idx`` from ``u0`` (the other values
        stay as in ``u0``): ``least_squares``, then a Nelder-Mead polish of its point (see the
        module); the better point and what it took."""
        from scipy.optimize import least_squares, minimize

        def full(x: np.ndarray) -> np.ndarray:
            u = u0.copy()
            u[active] = np.clip(x, 0.0, 1.0)
            return u

        def sse(x: np.ndarray) -> float:
            r = self.residuals(full(x), idx)
            return float(r @ r)

        sol = least_squares(lambda x: self.residuals(full(x), idx), u0[active],
                            jac=lambda x: self.jacobian(full(x), idx, active)[:, active], bounds=(0.0, 1.0),
                            method="trf", max_nfev=max_evals, xtol=1e-6, ftol=1e-8, gtol=1e-8)
        x_ls = np.asarray(sol.x)
        simplex = [x_ls] + [x_ls + NM_SIMPLEX * np.eye(len(active))[k] * (1 if x_ls[k] < 0.5 else -1)
                            for k in range(len(active))]
        nm = minimize(sse, x_ls, method="Nelder-Mead", bounds=[(0.0, 1.0)] * len(active),
                      options={"initial_simplex": np.array(simplex), "xatol": NM_XATOL, "fatol": NM_FATOL,
                               "maxfev": 2 * max_evals})
        ls_sse = sse(x_ls)
        better = float(nm.fun) < ls_sse
        info = Refined(ls_evals=int(sol.nfev), ls_jacobians=int(sol.njev or 0), nm_evals=int(nm.nfev),
                       ls_sse=ls_sse, sse=min(float(nm.fun), ls_sse), polish_moved=better)
        return full(np.asarray(nm.x) if better else x_ls), info

    def components(self, idx: list[int]) -> list[list[int]]:
        """The free values in independent groups over the rows of the measures ``idx``
        (:func:`~moesim.sim.study.fit_spec.value_groups`)."""
        return value_groups(self.free, list({self.measures[i].row.index: self.measures[i].row for i in idx}.values()))

    def measures_of(self, comp: list[int], idx: list[int]) -> list[int]:
        """The measures of ``idx`` that depend on a value of ``comp``."""
        return [i for i in idx if any(self.affects[j][i] for j in comp)]


def grid_points(n_keys: int, points: int | None) -> int:
    """Grid points per key: 5 for one or two keys, 4 for three, 3 for four, 2 beyond (at most
    81 combinations), unless given."""
    if points is not None:
        return points
    return {1: 5, 2: 5, 3: 4, 4: 3}.get(n_keys, 2)


def coarse_start(pb: Problem, fit_idx: list[int], points: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    """The start of the refinement: the best point of a grid over the keys (see the module)."""
    keys = list(dict.fromkeys(f.key for f in pb.free))
    g = grid_points(len(keys), points)
    axes: list[list[float]] = []
    for key in keys:
        j = next(j for j, f in enumerate(pb.free) if f.key == key)
        coords = [(i + 0.5) / g for i in range(g)]
        start = pb.free[j].start
        if start is not None:
            coords.append(float(pb.u_of([start] * len(pb.free))[j]))
        axes.append(coords)
    combos = list(itertools.product(*axes))
    us = [np.array([c[keys.index(f.key)] for f in pb.free]) for c in combos]
    _phase(pb, "coarse grid", pb.tasks([(u, fit_idx) for u in us]))
    res = pb.residuals_many([(u, fit_idx) for u in us])
    rows = [pb.measures[i].row for i in fit_idx]
    # squared error of each fit row at each combination
    sse = [{r.index: 0.0 for r in rows} for _ in combos]
    for c, r in enumerate(res):
        for k, i in enumerate(fit_idx):
            sse[c][pb.measures[i].row.index] += float(r[k] ** 2)
    glob = [k for k, key in enumerate(keys) if all(f.per is None for f in pb.free if f.key == key)]
    pers = sorted({f.per for f in pb.free if f.per is not None})
    cells: dict[tuple[str, ...], list[int]] = {}
    for row in {row.index: row for row in rows}.values():
        cells.setdefault(tuple(row.groups[p] for p in pers), []).append(row.index)

    def gkey(c: int) -> tuple[float, ...]:
        return tuple(combos[c][k] for k in glob)

    totals: dict[tuple[float, ...], float] = {}
    for gamma in dict.fromkeys(gkey(c) for c in range(len(combos))):
        same = [c for c in range(len(combos)) if gkey(c) == gamma]
        totals[gamma] = sum(min(sum(sse[c][i] for i in members) for c in same) for members in cells.values())
    best = min(totals, key=lambda k: totals[k])
    same = [c for c in range(len(combos)) if gkey(c) == best]
    u0 = np.array(us[same[0]])
    for j, f in enumerate(pb.free):
        if f.per is not None:
            members = [r.index for r in rows if r.groups[f.per] == f.group]
            c = min(same, key=lambda c: sum(sse[c][i] for i in members))
            u0[j] = combos[c][keys.index(f.key)]
    info = {"grid_points_per_key": g, "grid_combinations": len(combos),
            "grid_best_rms_log_error": round(math.sqrt(min(totals.values()) / max(1, len(fit_idx))), 6)}
    return u0, info


def _rel_std(jac: np.ndarray, r: np.ndarray, pb: Problem) -> list[float | None]:
    """Approximate relative standard errors: the Gauss-Newton covariance in log space."""
    m, n = jac.shape
    if m <= n or n == 0:
        return [None] * n
    jl = jac / pb.span
    s2 = float(r @ r) / (m - n)
    cov = s2 * np.linalg.pinv(jl.T @ jl)
    sens = np.abs(jl).sum(axis=0) > 0
    return [round(float(math.sqrt(max(cov[j, j], 0.0))), 6) if sens[j] else None for j in range(n)]


_WORKER: dict[float, Problem] = {}


def _refine_task(task: tuple[float, np.ndarray, list[int], list[int], int]) -> tuple[np.ndarray, Refined, int]:
    """In a worker: :meth:`Problem.solve` on the worker's own runs; the point, what it took and
    the runs it made."""
    from moesim.sim.study.fit_runs import worker_measurements

    diff_step, u0, idx, active, max_evals = task
    if diff_step not in _WORKER:
        ms = worker_measurements()
        _WORKER[diff_step] = Problem(ms, RowRunner(ms, jobs=1), diff_step)
    pb = _WORKER[diff_step]
    before = pb.runner.runs
    u, info = pb.solve(u0, idx, active, max_evals)
    return u, info, pb.runner.runs - before


def refine_many(pb: Problem, tasks: list[tuple[np.ndarray, list[int], list[int]]],
                max_evals: int) -> list[tuple[np.ndarray, Refined]]:
    """Independent refinements (start, measures, values): in this process, or one per task
    over the worker processes when there are several."""
    prog = pb.runner.progress
    if pb.runner.jobs_n == 1 or len(tasks) < 2:
        done = []
        for u0, idx, active in tasks:
            done.append(pb.solve(u0, idx, active, max_evals))
            if prog is not None:
                prog.advance(1)
        return done
    args = [(pb.diff_step, u0, idx, active, max_evals) for u0, idx, active in tasks]
    out = []
    for u, info, runs in pb.runner.executor().map(_refine_task, args):
        pb.runner.runs += runs
        if prog is not None:
            prog.runs(runs)
            prog.advance(1)
        out.append((u, info))
    return out


def _loo(pb: Problem, u: np.ndarray, fit_idx: list[int], jac: np.ndarray, r: np.ndarray,
         method: LooMethod, max_evals: int) -> dict[int, np.ndarray]:
    """For each fit row that has one: the values of the fit without it (see the module). A refit
    moves only the values of the row's independent group, on that group's other rows."""
    fit_rows = list(dict.fromkeys(pb.measures[i].row.index for i in fit_idx))
    comps = pb.components(fit_idx)
    out: dict[int, np.ndarray] = {}
    refits: list[tuple[int, tuple[np.ndarray, list[int], list[int]]]] = []
    for row in fit_rows:
        keep = [k for k, i in enumerate(fit_idx) if pb.measures[i].row.index != row]
        mine = [j for j, f in enumerate(pb.free) if f.applies_to(pb.ms.rows[row])]
        if not keep or any(not any(pb.affects[j][fit_idx[k]] for k in keep) for j in mine):
            continue   # a value of this row that no other fit row constrains: no prediction
        if method == "one-step":
            delta = np.linalg.lstsq(jac[keep], -r[keep], rcond=1e-10)[0]
            out[row] = np.clip(u + delta, 0, 1)
        else:
            comp = next(c for c in comps if mine[0] in c)
            refits.append((row, (u, pb.measures_of(comp, [fit_idx[k] for k in keep]), comp)))
    if pb.runner.progress is not None and refits:
        pb.runner.progress.phase("leave-one-out", len(refits), "refits")
    for (row, _), (u_row, _) in zip(refits, refine_many(pb, [t for _, t in refits], max_evals), strict=True):
        out[row] = u_row
    return out


def _optimise(pb: Problem, fit_idx: list[int], grid: int | None, max_evals: int,
              diff_step: float) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The coarse start and the refinement of every independent group: the start, the fitted
    point and what it took."""
    if not pb.free:
        return np.zeros(0), np.zeros(0), {"method": "none: no free values (fit: {}); every row is predicted as "
                                                    "its scenario gives it"}
    u0, info = coarse_start(pb, fit_idx, grid)
    u = u0.copy()
    comps = pb.components(fit_idx)
    sols = []
    if pb.runner.progress is not None:
        pb.runner.progress.phase("refinement", len(comps), "groups")
    for comp, (u_comp, refined) in zip(comps, refine_many(pb, [(u0, pb.measures_of(c, fit_idx), c) for c in comps],
                                                          max_evals), strict=True):
        u[comp] = u_comp[comp]
        sols.append(refined)
    info.update({"method": "scipy.optimize.least_squares (trf, bounded, log-space unit cube)",
                 "polish": f"Nelder-Mead from the least-squares point, first simplex {NM_SIMPLEX} of the unit cube",
                 "diff_step": diff_step, "max_evals": max_evals, "independent_groups": len(sols),
                 "evaluations": sum(x.ls_evals for x in sols), "jacobians": sum(x.ls_jacobians for x in sols),
                 "polish_evaluations": sum(x.nm_evals for x in sols),
                 "polish_improved_groups": sum(x.polish_moved for x in sols),
                 "sse_after_least_squares": round(sum(x.ls_sse for x in sols), 8),
                 "sse": round(sum(x.sse for x in sols), 8)})
    return u0, u, info


LOO_METHODS = {"one-step": "one Gauss-Newton step without the row, then the row run at those values",
               "refit": "refit without the row, then the row run at those values", "none": "not computed"}


def _phase(pb: Problem, name: str, tasks: list[tuple[int, Values]]) -> None:
    """Start a progress phase of the runs of ``tasks`` not yet known."""
    if pb.runner.progress is not None:
        pb.runner.progress.phase(name, pb.runner.pending(tasks))


def fit_measurements(ms: Measurements, *, jobs: int = 1, grid: int | None = None, max_evals: int = 40,
                     diff_step: float = 0.03, loo: LooMethod = "refit", progress: Any = None) -> FitResult:
    """Fit the free values of ``ms`` to its fit rows and predict every row (see the module).
    ``progress``: a :class:`~moesim.sim.study.fit_progress.FitProgress` to tell of each phase
    and run (it changes nothing in the result, nor does ``jobs``)."""
    t0 = time.perf_counter()
    runner = RowRunner(ms, jobs=jobs)
    try:
        pb = Problem(ms, runner, diff_step)
        fit_idx = [i for i, m in enumerate(pb.measures) if m.row.role == "fit"]
        all_idx = list(range(len(pb.measures)))
        # every row runs once before the fit: a row that does not run, or lacks its metric, stops it
        # here, with its one-line error alone on stderr (progress is shown from the next phase on)
        pb.residuals(np.full(len(pb.free), 0.5), all_idx)
        runner.progress = progress
        if progress is not None:
            progress.phase("first run of every row", runner.runs)
            progress.runs(runner.runs)
        u0, u, optimizer = _optimise(pb, fit_idx, grid, max_evals, diff_step)
        _phase(pb, "jacobian at the fit", pb.tasks(pb.jacobian_points(u, fit_idx)[0]))
        jac = pb.jacobian(u, fit_idx)
        r_fit = pb.residuals(u, fit_idx)
        theta, theta0 = pb.theta(u), pb.theta(u0)
        loo = loo if pb.free and fit_idx else "none"
        loo_u = {} if loo == "none" else _loo(pb, u, fit_idx, jac, r_fit, loo, max_evals)
        loo_idx = {row: [i for i in fit_idx if pb.measures[i].row.index == row] for row in loo_u}
        _phase(pb, "final runs", pb.tasks([(u, all_idx)] + [(loo_u[row], loo_idx[row]) for row in loo_u]))
        pb.residuals_many([(u, all_idx)] + [(loo_u[row], loo_idx[row]) for row in loo_u])
        predicted = [pb.predicted(m, theta) for m in pb.measures]
        loo_pred: list[float | None] = [None] * len(pb.measures)
        for row in loo_u:
            for i in loo_idx[row]:
                loo_pred[i] = pb.predicted(pb.measures[i], pb.theta(loo_u[row]))
        stds = _rel_std(jac, r_fit, pb)
        ratio = [p / m.measured for p, m in zip(predicted, pb.measures, strict=True)]
        test_idx = [i for i, m in enumerate(pb.measures) if m.row.role == "test"]
        values = []
        for j, f in enumerate(pb.free):
            bound = "min" if u[j] <= 1e-3 else "max" if u[j] >= 1 - 1e-3 else None
            rows = [pb.measures[i].row.label for i in fit_idx if pb.affects[j][i]]
            held = [ratio[i] for i in test_idx if pb.affects[j][i]]
            values.append(FittedValue(f, theta[j], theta0[j], bound, stds[j], list(dict.fromkeys(rows)),
                                      summarise(held) if held else None))
        loo_r = [lp / pb.measures[i].measured for i in fit_idx if (lp := loo_pred[i]) is not None]
        paths: dict[str, int] = {}
        for m in pb.measures:
            path = runner.outcome(m.row.index, pb.row_values(m.row, theta)).engine_path
            paths[path] = paths.get(path, 0) + 1
        optimizer["rms_log_error"] = round(math.sqrt(float(r_fit @ r_fit) / max(1, len(r_fit))), 6)
        return FitResult(
            ms=ms, values=values, measures=pb.measures, predicted=predicted, loo_predicted=loo_pred,
            fit_error=summarise([ratio[i] for i in fit_idx]),
            loo_error=None if loo == "none" else summarise(loo_r),
            held_out=summarise([ratio[i] for i in test_idx]) if test_idx else None,
            loo_method=LOO_METHODS[loo], optimizer=optimizer, runs=runner.runs, engine_paths=paths,
            wall_s=time.perf_counter() - t0)
    finally:
        runner.close()
