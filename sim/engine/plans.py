"""Plans: checking what a policy says should run, and accounting what a lossy plan changed.

A plan is valid when it has one row per token, expert ids in ``-1..E-1``, no expert twice for
one token, and (for a policy that is not ``lossy``) exactly the routed experts. Per token, the
lossy accounting counts substitutions (experts that run but were not routed to it), drops
(routed experts neither run nor replaced), the routed probability mass that still runs, whether
the top-1 routed expert runs, and how many slots run (the effective top-k).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.contract.base import Plan, Routing
from moesim.sim.engine.records import RunStats
from moesim.sim.engine.transfers import PolicyError


def check_plan(plan: Plan, routing: Routing, *, policy_name: str, lossy: bool, num_experts: int,
               iteration: int, layer: int) -> np.ndarray:
    """Validate a policy's plan at ``iteration``, ``layer`` (named in the error); returns its
    experts as an int matrix."""
    ex = np.asarray(plan.experts)
    if ex.shape[0] != routing.n_tokens:
        raise PolicyError(f"policy {policy_name!r} planned {ex.shape[0]} tokens at iteration {iteration}, layer {layer}; the iteration has {routing.n_tokens}")
    rows = ex.tolist()   # Python lists: a plan has a few short rows
    if ex.size <= 64:   # a few slots: Python's min and max are quicker than two numpy reductions
        lo = min([min(row) for row in rows if row], default=0)
        hi = max([max(row) for row in rows if row], default=0)
    else:
        lo, hi = (int(ex.min()), int(ex.max())) if ex.size else (0, 0)
    if lo < -1 or hi >= num_experts:
        raise PolicyError(f"policy {policy_name!r} planned an expert outside -1..{num_experts - 1} at iteration {iteration}, layer {layer}")
    for row in rows:
        valid = [x for x in row if x >= 0]
        if len(set(valid)) != len(valid):
            raise PolicyError(f"policy {policy_name!r} planned one expert twice for a token at iteration {iteration}, layer {layer}: {row}")
    if not lossy and not _same_experts(ex, rows, routing.experts):
        raise PolicyError(f"policy {policy_name!r} is not lossy but planned other experts than the routing at iteration {iteration}, layer {layer}")
    return ex


def _same_experts(ex: np.ndarray, rows: list[Any], routed: np.ndarray) -> bool:
    """``np.array_equal(ex, routed)``, with ``rows`` (``ex.tolist()``) compared as Python lists
    when the plan is small: the same answer (equal shapes, equal values) without numpy's
    per-call cost."""
    if ex.shape != routed.shape:
        return False
    if ex.size <= 64:
        return bool(rows == routed.tolist())
    return bool(np.array_equal(ex, routed))


def count_lossy(st: RunStats, routing: Routing, plan: np.ndarray | None) -> None:
    """Add one layer's substitutions, drops, mass kept, top-1 agreement and slots run to ``st``
    (``plan`` None: everything ran as routed).

    The mass kept of a token is the routed weights that still run over all its routed weights,
    each sum taken in the weights' own type (a float32 trace: float32 sums, numpy's for the
    whole row); the shortcuts below give those same floats without numpy calls where the sum
    is exact in any type: no weight or one weight kept, or both of two."""
    orig = routing.experts
    n, k = orig.shape
    st.token_layers += n
    if plan is None:
        st.mass_kept_sum += n
        st.top1_kept += n
        st.slots_run += n * k
        return
    w = routing.weights
    routed_rows = orig.tolist()
    plan_rows = plan.tolist()
    for t in range(n):
        routed = routed_rows[t]
        ran = [x for x in plan_rows[t] if x >= 0]
        ran_set = set(ran)
        subs = sum(1 for x in ran if x not in routed)
        missing = sum(1 for x in routed if x not in ran_set)
        st.substitutions += subs
        st.dropped += max(0, missing - subs)
        st.slots_run += len(ran)
        st.top1_kept += routed[0] in ran_set
        keep = [j for j in range(k) if routed[j] in ran_set]
        if w is None:   # equal weights: sums of ones are exact
            tot = float(k)
            kept = float(len(keep))
        else:
            wt = w[t]
            tot = float(wt.sum())
            if not keep:
                kept = 0.0
            elif len(keep) == 1:
                kept = float(wt[keep[0]])   # 0 + w is w in any type
            elif len(keep) == k == 2:
                kept = tot                  # w0 + w1, one rounding in the weights' type either way
            else:
                kept = float(sum(wt[j] for j in keep))
        st.mass_kept_sum += kept / tot if tot > 0 else 1.0
        st.lossy_layers += bool(subs or missing)


ONE_HOT_CELLS = 16384
"""Above 64 slots, :func:`access_order` compares every slot with every expert id when that
table (experts x slots) has at most this many cells: quicker than sorting (a prefill chunk of
a few hundred tokens on 8 experts), slower for many experts."""


def access_order(valid: np.ndarray, num_experts: int | None = None) -> tuple[list[int], list[int]]:
    """Distinct experts of ``valid`` (flattened, tokens in order) by first occurrence, and how
    many tokens each serves (``num_experts``, when given, bounds the ids: 0..num_experts-1)."""
    if valid.size <= 64:   # a few tokens' slots: a dict in first-occurrence order is quicker
        counts: dict[int, int] = {}
        for x in valid.tolist():
            counts[x] = counts.get(x, 0) + 1
        return list(counts), list(counts.values())
    if num_experts is not None and num_experts * valid.size <= ONE_HOT_CELLS:
        eq = valid[None, :] == np.arange(num_experts, dtype=valid.dtype)[:, None]
        n_per = eq.sum(axis=1)
        present = np.flatnonzero(n_per)
        ranked = present[np.argsort(eq.argmax(axis=1)[present], kind="stable")]
        return ranked.tolist(), n_per[ranked].tolist()
    uniq, first, cnt = np.unique(valid, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return [int(x) for x in uniq[order]], [int(x) for x in cnt[order]]


def next_in_fixed_order(remaining: list[Any], early: set[int]) -> Any:
    """The expert a layer computes next while demand loads wait for room: the first of
    ``remaining`` (in access order) that was resident or already being copied when the layer
    was routed (``early``: the ``id`` of those entries), else the first remaining demand load.

    Computing one expert at a time in this fixed order, whatever has landed meanwhile, makes
    the room each computed expert frees, and so every later victim choice, independent of when
    copies land; the simulator and the executor then make the same choices and their hit
    rates agree exactly even when a layer needs more experts than its pool holds (a prefill at
    a low cache rate). Demand loads get room in access order, so the first remaining one has
    room whenever any later one has."""
    for x in remaining:
        if id(x) in early:
            return x
    return remaining[0]
