"""Aborting a prefetch (``view.abort_prefetch``): MoEpic terminates the prefetch of a layer once
it is routed (section 3.2 of the paper), on an exact timeline; the engine's rules for a queued
copy, a demand load, a pinned unit and fifo order; the SimPy-free driver aborts as the event
loop does.

Hardware (tests.util): layer 600 us, expert 50 us, PCIe 3 GB/s with no latency: a 3 MB expert
loads in 1000 us.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moesim.policies.baselines.speculative import MixtralOffloading
from moesim.policies.contract.base import ABSENT, INFLIGHT, QUEUED, RESIDENT, Policy, UnitKey, View
from moesim.policies.moepic.policy import MoEpic
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import make_trace, run_engine, step_us, steps, tiny_hw, tiny_model

MB = 3_000_000


class _Watched(MoEpic):
    """MoEpic that notes, at each ``on_cancel``, the time, the unit's state, the free buffer
    bytes and what the lane is doing."""

    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        self.cancels: list[tuple[float, UnitKey, int, int]] = []
        self.landed: list[UnitKey] = []

    def on_cancel(self, view: View, unit: UnitKey) -> None:
        self.cancels.append((round(view.now * 1e6, 6), unit, view.state(*unit), view.buffer_free()))
        super().on_cancel(view, unit)

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        self.landed.append(unit)
        super().on_loaded(view, unit, demand)


def _wrong_guess_trace() -> Any:
    # one token; layer 0 runs expert 0, layer 1 expert 1; the lookahead of layer 0 guesses
    # expert 2 for layer 1 (wrong), that of layer 1 guesses expert 0 for the next token's layer 0
    look = np.zeros((1, 2, 4), dtype=np.float16)
    look[0, 0, 2] = 5.0
    look[0, 1, 0] = 5.0
    return make_trace([[[0], [1]]], num_experts=4, lookahead=look)


def test_moepic_aborts_a_wrong_guess_in_flight_when_the_layer_is_routed() -> None:
    pol = _Watched(theta=1.0, configurator=False)   # whole experts: one part each
    eng, m = run_engine(_wrong_guess_trace(), pol, tiny_model(2, 4, 1), tiny_hw(layer_us=600),
                        budget_experts=2, buffer_experts=1, timeline=True)
    # L0: attention 0-600; expert 0 misses and loads on demand 600-1600 (the pool has room);
    #     after routing, layer 1's guess (expert 2) is prefetched into the buffer, queued behind
    #     the demand load: in flight from 1600, due at 2600. Compute 1600-1650.
    # L1: attention 1650-2250; routed at 2250: expert 1, not the guess. MoEpic aborts the copy
    #     of expert 2 at 2250 (650 of its 1000 us ran: 1.95 MB moved); the lane frees at once
    #     and expert 1's demand load runs 2250-3250 (without the abort it would start at 2600);
    #     compute 3250-3300.
    assert step_us(eng) == [1650, 1650]
    assert [(s.hits, s.late, s.misses) for s in steps(eng)] == [(0, 0, 1), (0, 0, 1)]
    pcie = [(label, round(t * 1e6, 6), round(d * 1e6, 6), info) for lane, label, t, d, info in eng.state.timeline
            if lane.startswith("PCIe")]
    assert pcie == [("L0 E0", 600, 1000, {"demand": True, "bytes": MB}),
                    ("L1 E2", 1600, 650, {"demand": False, "bytes": 1_950_000, "aborted": True}),
                    ("L1 E1", 2250, 1000, {"demand": True, "bytes": MB})]
    # the reservation is released at the abort: the buffer is free again when on_cancel runs
    assert pol.cancels == [(2250, (1, 2, 0), ABSENT, MB)]
    assert (1, 2, 0) not in pol.landed               # its timeout, still scheduled, lands nothing
    assert sorted(eng.state.vram.units) == [(0, 0, 0), (1, 1, 0)] and eng.state.vram.buffer_used == 0
    assert eng.state.transfers.lanes.inflight_count == 0
    assert m["aborted_prefetches"] == 1 and m["aborted_prefetch_gb"] * 1e9 == pytest.approx(1_950_000)
    assert m["prefetch_gb"] * 1e9 == pytest.approx(1_950_000)   # the bytes moved, not the 3 MB issued
    assert m["wasted_prefetch_gb"] * 1e9 == pytest.approx(1_950_000)
    assert m["demand_gb"] * 1e9 == pytest.approx(2 * MB)
    assert m["pcie_busy_ms"] == pytest.approx(2.65)                  # 1000 + 650 + 1000 us


class _AbortAt(Policy):
    """Demand caching with probes: prefetches ``issue`` (in order) when layer 0 is routed, then
    tries to abort ``at_route`` when layer 1 is routed, ``after`` in layer 1's ``after_layer``
    (its planned units are pinned then) and ``on_land`` when the first prefetch lands; notes
    each (unit, its state, the answer)."""

    name = "abort-probe"

    def __init__(self, issue: list[UnitKey], at_route: list[UnitKey] = (), after: list[UnitKey] = (),
                 on_land: list[UnitKey] = ()) -> None:
        self.issue, self.at_route, self.after, self.on_land = issue, list(at_route), list(after), list(on_land)
        self.answers: list[tuple[UnitKey, int, bool]] = []

    def _try(self, view: View, keys: list[UnitKey]) -> None:
        for key in keys:
            state = view.state(*key)
            self.answers.append((key, state, view.abort_prefetch(*key)))

    def after_layer(self, view: View, layer: int, outcome: Any) -> None:
        if layer == 0:
            for key in self.issue:
                view.prefetch(*key)
        else:
            self._try(view, self.after)

    def on_routed(self, view: View, layer: int, routing: Any) -> None:
        if layer == 1:
            self._try(view, self.at_route)

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        if not demand and self.on_land:
            keys, self.on_land = self.on_land, []
            self._try(view, keys)


def _run(pol: Policy, layer_us: float = 100, **kw: Any) -> tuple[Engine, dict[str, Any]]:
    # layer 0 runs experts 0 and 1, layer 1 experts 1 and 3; 3 experts per layer of room
    tr = make_trace([[[0, 1], [1, 3]]], num_experts=4)
    return run_engine(tr, pol, tiny_model(2, 4, 2), tiny_hw(layer_us=layer_us), budget_experts=6,
                      timeline=True, **kw)


def test_a_queued_prefetch_is_withdrawn_and_one_in_flight_stops() -> None:
    pol = _AbortAt([(1, 2, 0), (1, 0, 0)], at_route=[(1, 0, 0), (1, 2, 0)])
    eng, m = _run(pol)
    # L0: routed at 100; demand loads 100-1100-2100; compute 1100-1150, 2100-2150. The guesses
    #     queue behind the loads: expert 2 in flight from 2100, expert 0 queued behind it.
    # L1: attention 2150-2250; routed at 2250: expert 0's guess is withdrawn (nothing moved),
    #     expert 2's stops after 150 us (0.45 MB); the lane is free for layer 1's demand loads
    #     at once: 2250-3250-4250, compute 3250-3300, 4250-4300.
    assert pol.answers == [((1, 0, 0), QUEUED, True), ((1, 2, 0), INFLIGHT, True)]
    assert step_us(eng) == [2150, 2150]
    pcie = [(label, round(t * 1e6, 6), round(d * 1e6, 6), info["bytes"]) for lane, label, t, d, info
            in eng.state.timeline if lane.startswith("PCIe")]
    assert pcie == [("L0 E0", 100, 1000, MB), ("L0 E1", 1100, 1000, MB), ("L1 E2", 2100, 150, 450_000),
                    ("L1 E1", 2250, 1000, MB), ("L1 E3", 3250, 1000, MB)]
    assert m["aborted_prefetches"] == 1                          # the one in flight
    assert m["prefetch_gb"] * 1e9 == pytest.approx(450_000)      # the queued one moved nothing
    assert m["fetch_precision"] == 0.0                           # one prefetch started, never used
    assert sorted(eng.state.vram.units) == [(0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 3, 0)]


def test_abort_refuses_what_is_not_a_prefetch_on_its_way() -> None:
    # resident (the guess landed during a long layer 1 attention), absent, loaded on demand
    pol = _AbortAt([(1, 2, 0)], at_route=[(1, 2, 0), (1, 3, 0), (0, 0, 0)])
    _run(pol, layer_us=5000)
    assert pol.answers == [((1, 2, 0), RESIDENT, False), ((1, 3, 0), ABSENT, False),
                           ((0, 0, 0), RESIDENT, False)]
    # pinned: a right guess in flight is planned for layer 1; a demand load in flight
    pol = _AbortAt([(1, 1, 0)], after=[(1, 1, 0), (1, 3, 0)])
    _, m = _run(pol)
    assert pol.answers == [((1, 1, 0), INFLIGHT, False), ((1, 3, 0), QUEUED, False)]
    assert m["late"] == 1 and "aborted_prefetches" not in m
    # fifo order: an issued copy is neither withdrawn nor stopped
    pol = _AbortAt([(1, 2, 0), (1, 0, 0)], at_route=[(1, 0, 0), (1, 2, 0)])
    _, m = _run(pol, pcie_order="fifo")
    assert pol.answers == [((1, 0, 0), QUEUED, False), ((1, 2, 0), INFLIGHT, False)]
    assert "aborted_prefetches" not in m
    # awaited: under sync_prefetch the GPU waits at layer 1 for both guesses; when the first
    # lands the second, queued and awaited, is not aborted
    pol = _AbortAt([(1, 2, 0), (1, 0, 0)], on_land=[(1, 0, 0)])
    _, m = _run(pol, sync_prefetch=True)
    assert pol.answers == [((1, 0, 0), QUEUED, False)] and "aborted_prefetches" not in m


def test_the_driver_replays_aborts_as_the_event_loop() -> None:
    """A run whose policy can abort (MoEpic, a mixtral-offloading with a hook of its own that
    aborts, ``_AbortAt``) is taken by the SimPy-free driver (not a kernel: those never abort),
    which aborts as the event loop does: same metrics and step records."""

    class Aborting(MixtralOffloading):
        """mixtral-offloading that aborts a layer's prefetches not landed when the layer starts
        (a hook of its own: the prefetch kernel replays the shipped composition only)."""

        name = "aborting-mixtral"

        def before_layer(self, view: View, layer: int) -> None:
            super().before_layer(view, layer)
            for key in view.units_of_layer(layer):
                if view.state(*key) != RESIDENT:
                    view.abort_prefetch(*key)

    tr = make_trace([[[0], [1]]] * 3, num_experts=4, lookahead=np.zeros((3, 2, 4), dtype=np.float16))
    aborted = 0
    for make in (lambda: MoEpic(configurator=False), Aborting, lambda: _AbortAt([(1, 2, 0)])):
        out = []
        for fast in (True, False):
            wl = build_workload(tr, batch_size=1, phases=("decode",))
            eng = Engine(wl, make(), CostModel(tiny_model(2, 4, 1), tiny_hw()), budget_bytes=4 * MB,
                         fast_replay=FAST_PATH if fast else None)
            eng.run()
            assert eng.state.path == ("fast" if fast else "event"), eng.state.path_reason
            m = compute_metrics(eng.state)
            m.pop("engine_path")
            m.pop("engine_path_reason")
            out.append((m, {k: v.tolist() for k, v in eng.state.steps.columns().items()}))
        assert out[0] == out[1], eng.state.policy.name
        aborted += out[0][0].get("aborted_prefetches", 0)
    assert aborted > 0   # the runs do abort
