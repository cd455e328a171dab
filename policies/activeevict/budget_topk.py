"""ActiveEvict's budget-aware dynamic top-k (section 3.4, Eqs. 18-21): a lossy planner.

Once layer ``l`` is routed, ``C_avail = B - |C_l|`` free slots (Eq. 18) remain, counting as
taken every unit of the layer that is resident or issued (units still being copied back to the
host are free slots: their room is on its way). With the experts of a token in router order
``e_(1), e_(2), ...``, ``u(k)`` counts the non-resident ones among the first ``k`` (Eq. 19); the
token runs its first ``k_l = max{k <= k_max : u(k) <= C_avail}`` experts (Eqs. 20-21), the
rest are dropped, resident or not (A8: a prefix). Readings where the paper is silent ([rec] in
``activeevict.md``): with no feasible ``k`` the top-1 still runs, loaded on the critical path
(A7); the tokens of a batch share ``C_avail`` in token order and an expert loaded for an
earlier token is present for the later ones (A10); prefill runs as routed (A10); ``k_max`` may
not exceed the model's top-k (A14: widening is not described). The plan carries the weights
renormalised over the kept experts (Eq. 4).
"""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import Context, Plan, PolicySetupError, Routing, View
from moesim.policies.parts.planners import Planner


class BudgetTopKPlanner(Planner):
    """Shrink each token's routing width to the free slots of its layer (Eqs. 18-21). Counts
    ``shrunk`` (token rows it narrowed) and ``idle_slots`` (free slots its layers left free
    after their loads, over ``routed_layers`` layers: room pre-evicted for experts the routing
    did not need)."""

    def __init__(self, k_max: int | None = None) -> None:
        if k_max is not None and k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.shrunk = self.idle_slots = self.routed_layers = 0

    def setup(self, ctx: Context) -> None:
        """Slots per layer and the width cap."""
        if len(ctx.pool_capacity) != ctx.num_layers:
            raise PolicySetupError("dynamic top-k needs one pool per layer (scope: layer)")
        k_max = ctx.top_k if self.k_max is None else self.k_max
        if k_max > ctx.top_k:
            raise PolicySetupError(f"k_max {k_max} exceeds the model's top-k {ctx.top_k}: widening the "
                                   "routing is not described by the paper")
        self._k_max = k_max
        self._slots = [int(c // ctx.expert_bytes) for c in ctx.pool_capacity]
        self.shrunk = self.idle_slots = self.routed_layers = 0

    def widths(self, view: View, layer: int, experts: np.ndarray) -> list[int]:
        """``k_l`` for each token row of ``experts`` (router order), Eq. 20."""
        present = {k[1] for k in view.units_of_layer(layer)}
        avail = self._slots[layer] - len(present)
        out = []
        k_max = self._k_max
        for row in np.asarray(experts).tolist():
            best, used, new = 0, 0, []
            for k, e in enumerate(row[:k_max], 1):
                if e < 0:
                    break
                if e not in present:
                    used += 1
                    if used > avail:
                        break
                    new.append(e)
                best = k
            if best == 0:                       # no feasible k: the top-1 still runs (A7)
                best = 1
                e0 = row[0]
                new = [] if e0 in present else [e0]
            present.update(new)
            avail = max(0, avail - len(new))
            out.append(best)
        self.idle_slots += avail
        self.routed_layers += 1
        return out

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """Drop each token's experts past its ``k_l`` (decode only)."""
        if view.iteration.phase_name != "decode":
            return None
        ex = routing.experts
        ks = self.widths(view, layer, ex)
        if min(ks, default=ex.shape[1]) >= ex.shape[1]:   # every row keeps its full width
            return None
        plan = np.array(ex, dtype=np.int64, copy=True)
        for t, k in enumerate(ks):
            plan[t, k:] = -1
            self.shrunk += int(k < ex.shape[1])
        weights = None
        if routing.weights is not None:
            w = np.where(plan >= 0, np.asarray(routing.weights, dtype=np.float64), 0.0)
            tot = w.sum(axis=1, keepdims=True)
            weights = np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)
        return Plan(plan, weights=weights)
