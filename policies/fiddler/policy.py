"""``fiddler``: Fiddler (Kamahori, Tang, Gu, Kasikci, Zhao; "Fiddler: CPU-GPU Orchestration for
Fast Inference of Mixture-of-Experts Models", ICLR 2025, arXiv 2402.07033).

* **Placement**: as many experts as the budget holds, less ``staging_experts``, are put on the
  GPU with the model, in descending popularity over all layers from an offline profile (the
  scenario's ``profile:`` split; without one, the replayed requests, with a warning), and never
  leave (efeslab/fiddler ``set_expert_loc``: a list of (layer, expert) "in the order of
  popularity determined based on profile").
* **Per miss** (Algorithm 1): an expert of the layer that is not on the GPU, with ``s`` tokens
  routed to it, is copied to the GPU and run there when ``cpu_lat(s) > gpu_lat(s) +
  trans_lat``, else run on the CPU (only activations cross the link; their copies are
  neglected, as the paper does: "<1%"). ``decision: latency`` takes the three latencies from
  the run's own cost model (the CPU from the host model, the copy at the link's pinned rate),
  as Fiddler measures them at start-up; ``decision: repo`` uses the April-2024 code's fixed
  costs instead (``latency_cpu = 7`` per token, ``latency_gpu = 70``: the CPU for fewer than 10
  tokens).
* A copied expert goes through ``staging_experts`` slots (Fiddler's one GPU placeholder
  expert) and is not kept after its layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Plan,
    Policy,
    PolicySetupError,
    ReadView,
    Routing,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, SetupNeeds
from moesim.policies.contract.registry import register

DECISIONS = ("latency", "repo")
REPO_CPU_PER_TOKEN, REPO_GPU = 7, 70   # efeslab/fiddler src/fiddler/mixtral.py (Apr 2024), units unstated


@register
class Fiddler(Policy):
    """Popular experts resident on the GPU; each missed expert runs on the CPU or is copied,
    whichever the latency model says is faster for its tokens (see the module docstring)."""

    name = "fiddler"
    scope = "global"
    summary = "popular experts on the GPU; a miss runs on the CPU or is copied, whichever is faster"
    paper = ("Kamahori et al., Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-Experts "
             "Models (ICLR 2025, arXiv 2402.07033)")
    setup_needs = SetupNeeds(profile_share=DEFAULT_PROFILE_SHARE,
                             source="Fiddler: experts placed in the order of popularity determined by an offline "
                                    "profile (efeslab/fiddler set_expert_loc)")

    def __init__(self, *, staging_experts: int = 1, decision: str = "latency") -> None:
        if staging_experts < 1:
            raise ValueError("staging_experts must be >= 1 (a copied expert needs a slot)")
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
        self.staging_experts = staging_experts
        self.decision = decision
        self.popular: set[UnitKey] = set()
        self._cost: Any = None
        self._expert_bytes = 0
        self._copy_at: int | None = None
        self._copies_memo: dict[int, bool] = {}
        self._one_row: dict[tuple[int, ...], tuple[int, int, np.ndarray | None]] = {}
        self._may_hold: set[int] = set()   # layers that may hold a unit outside the popular set
        self.counts = {"copied": 0, "on_cpu": 0}

    def read_columns(self) -> frozenset[str]:
        """No optional trace column: its placement comes from the profile's popularity and its choice from the cost model."""
        return frozenset()

    def setup(self, ctx: Context) -> None:
        """Choose the popular set and find the token count from which a copy beats the CPU."""
        slots = ctx.total_budget // ctx.expert_bytes - self.staging_experts
        if slots < 0:
            raise PolicySetupError(f"fiddler: the expert budget holds {ctx.total_budget // ctx.expert_bytes} "
                                   f"experts, fewer than staging_experts ({self.staging_experts})")
        freq = np.asarray(ctx.offline_frequency())
        order = np.argsort(-freq.reshape(-1), kind="stable")[:slots]   # ties: lower layer, lower expert
        E = ctx.num_experts
        self.popular = {(int(i) // E, int(i) % E, 0) for i in order}
        self._cost = ctx.cost
        self._expert_bytes = ctx.expert_bytes
        self._copies_memo = {}
        self._one_row = {}
        self._may_hold = set()
        self.counts = {"copied": 0, "on_cpu": 0}

    def copies(self, n_tokens: int) -> bool:
        """Algorithm 1's test for an expert missing from the GPU with ``n_tokens`` tokens:
        True (copy it and run it on the GPU) when the CPU would be slower."""
        if self.decision == "repo":
            return not REPO_CPU_PER_TOKEN * n_tokens < REPO_GPU
        c = self._cost
        return bool(c.cpu_expert_s(n_tokens) > c.expert_s(n_tokens) + c.transfer_s(self._expert_bytes))

    def preload(self, ctx: Context) -> list[UnitKey]:
        """The popular experts, loaded with the model."""
        return sorted(self.popular)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """``cache.initial`` places nothing here: its units leave."""
        for key in units:
            if key not in self.popular and not view.evict(*key):
                self._may_hold.add(key[0])

    def decide(self, layer: int, rows: list[list[int]]) -> tuple[int, int, np.ndarray | None]:
        """Algorithm 1 for one layer's routed ``rows``: how many missing experts are copied, how
        many run on the CPU, and the ``on_cpu`` mask of the slots (None when none does)."""
        tokens: dict[int, int] = {}   # Python on a few short rows: quicker than np.unique on them
        for row in rows:
            for e in row:
                if e >= 0:
                    tokens[e] = tokens.get(e, 0) + 1
        popular, memo = self.popular, self._copies_memo
        copied = 0
        cpu: set[int] = set()
        for e, n in tokens.items():
            if (layer, e, 0) in popular:
                continue
            copy = memo.get(n)
            if copy is None:   # the cost model is fixed once set up: one answer per token count
                copy = memo[n] = self.copies(n)
            if copy:
                copied += 1
            else:
                cpu.add(e)
        if not cpu:
            return copied, 0, None
        return copied, len(cpu), np.array([[e in cpu for e in row] for row in rows], dtype=bool)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """Resident experts run on the GPU; each missing one is copied or runs on the CPU (one
        token's answer is kept per routed row: it depends on nothing else once set up)."""
        ex = routing.experts
        rows = ex.tolist()
        if len(rows) == 1:
            key = (layer, *rows[0])
            got = self._one_row.get(key)
            if got is None:
                got = self._one_row[key] = self.decide(layer, rows)
                if got[2] is not None:
                    got[2].flags.writeable = False   # shared by the plans of this row
        else:
            got = self.decide(layer, rows)
        copied, on_cpu_n, on_cpu = got
        if copied:
            self.counts["copied"] += copied
            self._may_hold.add(layer)
        if on_cpu is None:
            return None
        self.counts["on_cpu"] += on_cpu_n
        return Plan(ex.copy(), on_cpu=on_cpu)

    def on_layer_end(self, view: View, layer: int) -> None:
        """Copied experts are not kept. Only a layer where an expert was copied (or a warm unit
        stayed) can hold one: the others are not scanned."""
        if layer not in self._may_hold:
            return
        kept = False
        for key in view.units_of_layer(layer):
            if key not in self.popular and not view.evict(*key):
                kept = True
        if not kept:
            self._may_hold.discard(layer)

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """A copied expert left in a staging slot; never a popular one."""
        for key in request.candidates:
            if key not in self.popular:
                return key
        return request.decline

    def report(self) -> dict[str, Any]:
        """How many experts were placed, and what the misses did."""
        return {"gpu_experts": len(self.popular), **self.counts}
