"""Planners: what runs once a layer's routing is known (``on_routed``). A lossless policy has
none (everything runs as routed); lossy ones substitute, drop or commit experts."""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import ABSENT, Context, Plan, Policy, Routing, View


class Planner(Policy):
    """Base of the planners: ``on_routed`` returns a :class:`~moesim.policies.contract.base.Plan`."""

    def read_columns(self) -> frozenset[str]:
        """A planner reads what it requires unless it says more."""
        return self.required_columns()


class RandomSubstitutePlanner(Planner):
    """Each routed expert that is absent (would be a demand load) is replaced by a random
    resident expert of the same layer that the token does not already use, up to
    ``max_per_token`` replacements per token (None: no cap); with no resident candidate it loads
    on demand. The random baseline of the substitution papers (BuddyMoE's random buddy)."""

    def __init__(self, max_per_token: int | None = None) -> None:
        if max_per_token is not None and max_per_token < 0:
            raise ValueError("max_per_token must be >= 0")
        self.max_per_token = max_per_token
        self._rng = np.random.default_rng(0)

    def setup(self, ctx: Context) -> None:
        """Take the run's random stream."""
        self._rng = ctx.rng

    def demand_only(self) -> bool:
        """It only swaps absent experts for resident ones: nothing is loaded, run on the CPU or
        waited for, and no decision time is charged."""
        return True

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """Substitute absent experts by random resident ones."""
        ex = routing.experts
        rows = ex.tolist()
        state = view.state
        absent: dict[int, bool] = {}   # each routed id's state, asked once (no hook acts in between)
        some = False
        for row in rows:
            for e in row:
                if e not in absent:
                    a = absent[e] = state(layer, e) == ABSENT
                    some = some or a
        if not some:   # nothing to replace: no plan, and no random draw either way
            return None
        held: set[int] = set()   # experts of the layer whose every part is resident
        is_resident = view.is_resident
        for k in view.resident_units(view.pool_of(layer)):
            e = k[1]
            if k[0] == layer and e not in held and is_resident(layer, e):
                held.add(e)
        if not held:
            return None
        resident = sorted(held)
        integers = self._rng.integers
        cap = ex.shape[1] if self.max_per_token is None else self.max_per_token
        plan = ex.copy()
        changed = False
        for t, row in enumerate(rows):
            used = set(row)
            n = 0
            for r, e in enumerate(row):
                if n >= cap:
                    break
                if not absent[e]:
                    continue
                cands = [b for b in resident if b not in used]
                if not cands:
                    break
                # integers(1) is 0 and draws nothing from the stream: one candidate needs no call
                b = cands[0] if len(cands) == 1 else cands[int(integers(len(cands)))]
                plan[t, r] = b
                used.add(b)
                n += 1
                changed = True
        return Plan(plan) if changed else None
