"""Each pool's victims (resident units outside the buffer) kept current by Vram, in pool order,
whatever order the units land in, and the global pool's units per layer; Vram.check verifies them."""

from __future__ import annotations

import pytest

from moesim.policies.contract.base import QUEUED, RESIDENT
from moesim.sim.engine.vram import Unit, Vram, VramError


def _issued(vram: Vram, key: tuple[int, int, int], allow_buffer: bool = False) -> Unit:
    u = Unit(key, 10, 0, False)
    assert vram.take_room(u, allow_buffer)
    vram.add(u)
    u.state = QUEUED
    return u


def test_landing_out_of_order_keeps_pool_order() -> None:
    vram = Vram([30], buffer_bytes=10)
    a, b, c = (_issued(vram, (0, e, 0)) for e in range(3))
    vram.landed(c)
    vram.landed(a)
    assert vram.candidates(0) == [(0, 0, 0), (0, 2, 0)]
    vram.landed(b)
    assert vram.candidates(0) == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]
    vram.check()


def test_pins_buffer_and_removal() -> None:
    vram = Vram([20], buffer_bytes=10)
    a, b = _issued(vram, (0, 0, 0)), _issued(vram, (0, 1, 0))
    buf = _issued(vram, (0, 2, 0), allow_buffer=True)   # the pool is full: it takes the buffer
    assert buf.in_buffer
    for u in (a, b, buf):
        vram.landed(u)
    assert vram.candidates(0) == [(0, 0, 0), (0, 1, 0)]   # not the buffered unit
    vram.pinned.add((0, 0, 0))
    assert vram.candidates(0) == [(0, 1, 0)]
    vram.pinned.clear()
    vram.remove(a)
    vram.release(a)
    assert vram.move_to_pool(buf)
    assert vram.candidates(0) == [(0, 1, 0), (0, 2, 0)]
    vram.check()


def test_many_victims_drop_pinned_by_place() -> None:
    vram = Vram([100], buffer_bytes=0)
    units = [_issued(vram, (0, e, 0)) for e in range(10)]
    for u in reversed(units):
        vram.landed(u)
    vram.pinned.update({(0, 3, 0), (0, 7, 0), (1, 0, 0)})   # (1, 0, 0): not present
    assert vram.candidates(0) == [(0, e, 0) for e in range(10) if e not in (3, 7)]


def test_check_finds_a_victim_list_out_of_date() -> None:
    vram = Vram([20], buffer_bytes=0)
    u = _issued(vram, (0, 0, 0))
    u.state = RESIDENT   # set behind Vram's back: not listed
    with pytest.raises(VramError, match="victims"):
        vram.check()


def test_global_pool_keeps_its_units_per_layer_in_pool_order() -> None:
    vram = Vram([60], buffer_bytes=0)
    a, b, c, d = (_issued(vram, key) for key in [(1, 0, 0), (0, 3, 0), (1, 2, 0), (0, 1, 0)])
    vram.landed(c)
    assert {layer: list(units) for layer, units in vram.layer_units.items()} == {
        1: [(1, 0, 0), (1, 2, 0)], 0: [(0, 3, 0), (0, 1, 0)]}
    vram.remove(a)
    vram.release(a)
    vram.remove(c)
    vram.release(c)
    e = _issued(vram, (1, 0, 0))   # back: the newest of its layer
    assert list(vram.layer_units[1]) == [(1, 0, 0)]
    assert list(vram.layer_units[0]) == [(0, 3, 0), (0, 1, 0)]
    assert e is vram.layer_units[1][(1, 0, 0)] and b is vram.layer_units[0][(0, 3, 0)] and d.key in vram.units
    vram.check()


def test_check_finds_a_layer_index_out_of_date() -> None:
    vram = Vram([20], buffer_bytes=0)
    u = _issued(vram, (0, 0, 0))
    del vram.units[u.key]   # removed behind Vram's back: still indexed by layer
    del vram.pool_units[0][u.key]
    vram.release(u)
    with pytest.raises(VramError, match="units per layer"):
        vram.check()


def test_layer_pools_are_scanned_in_pool_order() -> None:
    vram = Vram([20, 20], buffer_bytes=0)   # a pool per layer: not tracked
    assert not vram.tracked
    a, b = _issued(vram, (0, 0, 0)), _issued(vram, (0, 1, 0))
    vram.landed(b)
    vram.landed(a)
    assert vram.candidates(0) == [(0, 0, 0), (0, 1, 0)]
    assert vram.candidates(1) == []
    vram.check()
