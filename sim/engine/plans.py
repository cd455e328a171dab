"""Plans: checking what a policy says should run, and accounting what a lossy plan changed.

A plan is valid when it has one row per token, expert ids in ``-1..E-1``, no expert twice for
one token, and (for a policy that is not ``lossy``) exactly the routed experts. Per token, the
lossy accounting counts substitutions (experts that run but were not routed to it), drops
(routed experts neither run nor replaced), the routed probability mass that still runs, whether
the top-1 routed expert runs, and how many slots run (the effective top-k).
"""

from __future__ import annotations

from struct import Struct
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
    if len(rows) == 1 and rows[0]:   # one token (batch 1): its row's own min and max
        lo, hi = min(rows[0]), max(rows[0])
    elif ex.size <= 64:   # a few slots: Python's min and max are quicker than two numpy reductions
        lo = min([min(row) for row in rows if row], default=0)
        hi = max([max(row) for row in rows if row], default=0)
    else:
        lo, hi = (int(ex.min()), int(ex.max())) if ex.size else (0, 0)
    if lo < -1 or hi >= num_experts:
        raise PolicyError(f"policy {policy_name!r} planned an expert outside -1..{num_experts - 1} at iteration {iteration}, layer {layer}")
    for row in rows:
        valid = row if lo >= 0 else [x for x in row if x >= 0]   # lo >= 0: no row drops a slot
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
    is exact in any type: no weight or one weight kept, or both of two. A row of two float32
    or float64 weights is summed in Python (:func:`_pair_sum`); other rows by numpy."""
    orig = routing.experts
    n, k = orig.shape
    st.token_layers += n
    if plan is None:
        st.mass_kept_sum += n
        st.top1_kept += n
        st.slots_run += n * k
        return
    w = routing.weights
    # two float32/float64 weights per token: their rows as Python floats (the same values)
    pair = None if w is None or k != 2 else _PAIR_SUM.get(w.dtype.char)
    w_rows = None if pair is None else w.tolist()   # type: ignore[union-attr]
    routed_rows = orig.tolist()
    plan_rows = plan.tolist()
    subs_n = dropped = slots = top1 = lossy_n = 0   # integer counts: summed here, added once
    for t in range(n):
        routed = routed_rows[t]
        ran = []   # plain loops: a comprehension or generator is a call of its own, and rows are short
        for x in plan_rows[t]:
            if x >= 0:
                ran.append(x)
        ran_set = set(ran)
        subs = 0
        for x in ran:
            if x not in routed:
                subs += 1
        keep = []
        for j in range(k):
            if routed[j] in ran_set:
                keep.append(j)
        missing = k - len(keep)   # routed experts that do not run (a row holds k distinct ones)
        subs_n += subs
        dropped += max(0, missing - subs)
        slots += len(ran)
        top1 += routed[0] in ran_set
        if w is None:   # equal weights: sums of ones are exact
            tot = float(k)
            kept = float(len(keep))
        elif w_rows is not None:
            assert pair is not None
            wr = w_rows[t]
            tot = pair(wr[0], wr[1])
            kept = 0.0 if not keep else wr[keep[0]] if len(keep) == 1 else tot
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
        st.mass_kept_sum += kept / tot if tot > 0 else 1.0   # per token: the float sum's order
        lossy_n += bool(subs or missing)
    st.substitutions += subs_n
    st.dropped += dropped
    st.slots_run += slots
    st.top1_kept += top1
    st.lossy_layers += lossy_n


_F32 = Struct("f")


def _f32_pair_sum(a: float, b: float, _pack: Any = _F32.pack, _unpack: Any = _F32.unpack) -> float:
    """numpy's float32 sum of the float32 values ``a`` and ``b`` (one float32 rounding of
    ``a + b``): their sum in float64, rounded to float32. Rounding twice gives the same float,
    as float64 holds more than twice float32's precision plus two bits (a float64 sum of two
    float32 values rounds to float32 as the exact sum does)."""
    s: float = _unpack(_pack(a + b))[0]
    return s


def _f64_pair_sum(a: float, b: float) -> float:
    """numpy's float64 sum of two values: the plain sum."""
    return a + b


_PAIR_SUM = {"f": _f32_pair_sum, "d": _f64_pair_sum}
"""Per weight dtype (its ``char``), the sum of a row of two weights as numpy's ``sum`` gives it."""


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
