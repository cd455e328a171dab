"""Replicated seeds: their mean, a 95% interval, and the ties a ranking must not hide.

A study run with several seeds (``simctl compare --seeds N``, or ``seed`` swept in a sweep
file) has one row per seed of each point. :func:`merge_seeds` folds them into one row per point:
every metric's mean over the seeds, ``seeds`` (how many finished) and ``<metric>_ci95``, the
half-width of the 95% confidence interval of the mean (Student's t with ``seeds - 1`` degrees of
freedom; 0 with one seed).

:func:`tie_ranks` ranks values best first and marks ties: a value is tied with the first of
its run when their intervals overlap (``|a - b| <= ci_a + ci_b``) or when they differ by at most
:data:`TIE_SHARE` of the larger (one seed gives no interval; a simulator is not exact to 1%),
and a run of ties shares the rank of its first (``2=``, ``2=``, then ``4``); a run is measured
from its first value, so that small steps do not chain into a tie of far-apart values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

SEED = "seed"
"""The swept key of replicated seeds."""
TIE_SHARE = 0.01
"""Values within this share of the larger are tied, whatever their intervals."""


def ci95(std: np.ndarray | pd.Series, count: np.ndarray | pd.Series) -> np.ndarray:
    """Half-width of the 95% interval of a mean of ``count`` samples with standard deviation
    ``std`` (0 where fewer than two samples)."""
    import numpy as np
    from scipy import stats

    n = np.asarray(count, dtype=np.float64)
    sd = np.nan_to_num(np.asarray(std, dtype=np.float64))
    out = np.zeros_like(n)
    many = n > 1
    out[many] = stats.t.ppf(0.975, n[many] - 1) * sd[many] / np.sqrt(n[many])
    return out


def has_seeds(df: pd.DataFrame) -> bool:
    """Whether the table replicates seeds (a ``seed`` column with several values)."""
    return SEED in df.columns and df[SEED].nunique() > 1


def merge_seeds(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """One row per (``keys``, policy) of a table with one row per seed: finished points'
    numeric columns averaged, with ``seeds`` and a ``<column>_ci95`` per numeric column; a
    point with no finished seed keeps its first row (its status and reason). A table without
    replicated seeds is returned as it is, with ``seeds`` 1 and intervals 0."""
    import pandas as pd

    if not has_seeds(df):
        out = df.copy()
        out["seeds"] = 1
        return out
    group = [k for k in keys if k != SEED and k in df.columns] + ["policy"]
    ok = df[df["status"] == "ok"]
    numeric = [c for c in ok.columns if c not in (*group, SEED) and pd.api.types.is_numeric_dtype(ok[c])
               and not pd.api.types.is_bool_dtype(ok[c])]
    g = ok.groupby(group, dropna=False, sort=False)
    first = g.first()
    mean = g[numeric].mean()
    std = g[numeric].std()
    count = g[numeric].count()
    merged = first.copy()
    merged[numeric] = mean[numeric]
    intervals = pd.DataFrame({f"{c}_ci95": ci95(std[c], count[c]) for c in numeric}, index=merged.index)
    merged = pd.concat([merged, intervals, g.size().rename("seeds")], axis=1).reset_index()
    done = set(map(tuple, merged[group].astype(str).to_numpy().tolist()))
    rest = df[df["status"] != "ok"].drop_duplicates(group)
    rest = rest[[tuple(r) not in done for r in rest[group].astype(str).to_numpy().tolist()]].assign(seeds=0)
    return pd.concat([merged, rest], ignore_index=True).drop(columns=[SEED])


def tie_ranks(values: Sequence[float], cis: Sequence[float] | None = None) -> list[tuple[int, bool]]:
    """(rank, tied) of each of ``values``, already ordered best first, with their interval
    half-widths ``cis`` (none: one seed); see the module docstring. A run of ties is measured
    from its first value, never chained (1% steps do not add up to a tie of 5%)."""
    vals = [float(v) for v in values]
    half = [float(c) for c in cis] if cis is not None else [0.0] * len(vals)
    out: list[tuple[int, bool]] = []
    head = 0
    for i, v in enumerate(vals):
        h = vals[head]
        if i and (abs(v - h) <= half[i] + half[head] or abs(v - h) <= TIE_SHARE * max(abs(v), abs(h))):
            out[head] = (head + 1, True)
            out.append((head + 1, True))
        else:
            head = i
            out.append((i + 1, False))
    return out
