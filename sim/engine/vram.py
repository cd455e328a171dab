"""Byte accounting of the expert VRAM budget: pools, the transfer buffer, pins, room draining
back to the host and room claimed by waiting prefetches, with one invariant check.

A :class:`Unit` (an expert, or a segment of one) holds its bytes from the moment its transfer is
issued until it leaves VRAM: in its pool (one per layer, or one global pool), or in the shared
transfer buffer (``cache.buffer_experts``). With ``swap_out`` an evicted unit's bytes stay
counted as *draining* until its copy back to the host lands. A prefetch that waits for draining
room *claims* it, so that a later allocation does not count on the same bytes. A re-split of the
pools (:meth:`Vram.set_capacities`) that shrinks a pool below bytes still draining *reserves*
them (a claim): the pool shrinks as they land, and the pools that grow are *owed* that room
until then.

One global pool (every layer's units in one pool, whose scan per eviction would be long) also
keeps its *victims*: its resident units outside the buffer (pinned or not), in the order they
came into the pool, kept current as units land, move in from the buffer and leave, so that room
is made without a scan of the pool (:meth:`Vram.candidates`; ``Vram.tracked``). A layer's pool
holds a handful of units: it is scanned, which costs less than keeping the list. The global pool
also keeps its present units per layer (``Vram.layer_units``), so that a layer's units are found
without a scan of every layer's.

Invariant (:meth:`Vram.check`): for every pool ``used <= capacity`` and
``reserved <= claimed <= draining``;
the buffer likewise; ``used`` equals the bytes of the units that hold room plus what drains;
a tracked pool's victims are its resident units outside the buffer, in pool order, and its
units per layer are its present units of that layer, in pool order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Any

from moesim.policies.contract.base import RESIDENT, WAITING, UnitKey


class Unit:
    """An expert (or a segment of one) that is waiting for room, queued, in flight or resident;
    also, after eviction with swap-out, one whose bytes drain back to the host."""

    __slots__ = ("key", "nbytes", "pool", "state", "event", "demand", "used", "in_buffer", "refetched", "seq")

    seq: int   # when it came into a tracked pool (set by Vram.add): its place among the victims

    def __init__(self, key: UnitKey, nbytes: int, pool: int, demand: bool) -> None:
        self.key = key
        self.nbytes = nbytes
        self.pool = pool
        self.state = WAITING
        self.event: Any = None      # a SimPy event, made when someone waits for the transfer
        self.demand = demand        # loaded on demand (else a prefetch)
        self.used = False           # accessed since it was brought in
        self.in_buffer = False      # holds room in the transfer buffer, not in its pool
        self.refetched = False      # its transfer counted as a refetch (soon after its eviction)


class VramError(AssertionError):
    """The VRAM invariant broke: a bug in the engine, never bad input."""


class Vram:
    """Pools, buffer, units and pins of one run. Room is only ever taken through
    :meth:`take_room` and given back through :meth:`release` / :meth:`drain`."""

    def __init__(self, capacities: list[int], buffer_bytes: int) -> None:
        self.capacity = [int(c) for c in capacities]
        self.used = [0] * len(self.capacity)
        self.draining = [0] * len(self.capacity)
        self.claimed = [0] * len(self.capacity)
        # a re-split whose shrinking pools still drain evicted bytes (:meth:`set_capacities`):
        # per pool, the draining room it keeps for the shrink (counted in ``claimed``) and the
        # room owed to a pool that grows, which it gets as those drains land
        self.reserved = [0] * len(self.capacity)
        self.owed = [0] * len(self.capacity)
        self.buffer_capacity = int(buffer_bytes)
        self.buffer_used = 0
        self.buffer_draining = 0
        self.units: dict[UnitKey, Unit] = {}
        self.pool_units: list[dict[UnitKey, Unit]] = [{} for _ in self.capacity]
        self.pinned: set[UnitKey] = set()
        self.tracked = len(self.capacity) == 1   # one pool: its victims are kept (module docstring)
        # per pool, its resident units outside the buffer in pool order: their ``seq`` (sorted)
        # and keys, side by side (see the module docstring)
        self.victim_seqs: list[list[int]] = [[] for _ in self.capacity]
        self.victim_keys: list[list[UnitKey]] = [[] for _ in self.capacity]
        self.next_seq = 0   # the ``seq`` of the next unit added
        # a tracked pool's present units by layer, each in pool order (see the module docstring)
        self.layer_units: defaultdict[int, dict[UnitKey, Unit]] = defaultdict(dict)
        self.peak = 0
        self.total = 0   # bytes held in all pools and the buffer: sum(used) + buffer_used, kept as it changes

    # -- units -----------------------------------------------------------------------------------
    def add(self, u: Unit) -> None:
        """``u`` is present (issued or resident)."""
        self.units[u.key] = u
        self.pool_units[u.pool][u.key] = u
        if self.tracked:
            self.layer_units[u.key[0]][u.key] = u
            u.seq = seq = self.next_seq
            self.next_seq = seq + 1
            if u.state == RESIDENT and not u.in_buffer:   # placed resident: the newest victim
                self.victim_seqs[u.pool].append(seq)
                self.victim_keys[u.pool].append(u.key)

    def units_of(self, layer: int) -> dict[UnitKey, Unit]:
        """The present units of ``layer`` in pool order: its own pool's (one pool per layer), or
        the tracked pool's per-layer dict. Live: copy it before units come or go."""
        if not self.tracked:
            return self.pool_units[layer]
        got = self.layer_units.get(layer)
        return {} if got is None else got

    def remove(self, u: Unit) -> None:
        """``u`` is no longer present (its room is released or drains separately)."""
        del self.units[u.key]
        del self.pool_units[u.pool][u.key]
        if self.tracked:
            del self.layer_units[u.key[0]][u.key]
            if u.state == RESIDENT and not u.in_buffer:
                self.unlist(u)

    def landed(self, u: Unit) -> None:
        """``u``'s transfer landed: it is resident (a victim, unless it is in the buffer)."""
        u.state = RESIDENT
        if self.tracked and not u.in_buffer:
            self.enlist(u)

    def enlist(self, u: Unit) -> None:
        """``u`` (present in a tracked pool) became resident outside the buffer: a victim, at
        its place in pool order."""
        seqs = self.victim_seqs[u.pool]
        seq = u.seq
        if not seqs or seqs[-1] < seq:   # the newest (often)
            seqs.append(seq)
            self.victim_keys[u.pool].append(u.key)
        else:
            i = bisect_left(seqs, seq)
            seqs.insert(i, seq)
            self.victim_keys[u.pool].insert(i, u.key)

    def unlist(self, u: Unit) -> None:
        """``u``, a victim of a tracked pool, leaves it."""
        seqs = self.victim_seqs[u.pool]
        i = bisect_left(seqs, u.seq)
        del seqs[i]
        del self.victim_keys[u.pool][i]

    def candidates(self, pool: int) -> list[UnitKey]:
        """Resident, unpinned units of ``pool`` outside the buffer, in pool order: the possible
        victims (a new list)."""
        pinned = self.pinned
        if not self.tracked:
            return [k for k, u in self.pool_units[pool].items()
                    if u.state == RESIDENT and not u.in_buffer and k not in pinned]
        victims = self.victim_keys[pool]
        if not pinned:
            return victims[:]
        if len(victims) <= 2 * len(pinned):   # few victims (a layer's pool): look each up
            cands = []   # a plain loop: a comprehension is a call of its own, and the list is short
            for k in victims:
                if k not in pinned:
                    cands.append(k)
            return cands
        cands = victims[:]   # many (a global pool): take out the pinned ones, found by seq
        if cands:
            units, seqs = self.units, self.victim_seqs[pool]
            drop = []
            for k in pinned:
                u = units.get(k)
                if u is not None and u.pool == pool and u.state == RESIDENT and not u.in_buffer:
                    drop.append(bisect_left(seqs, u.seq))
            if drop:
                drop.sort(reverse=True)
                for i in drop:
                    del cands[i]
        return cands

    # -- room ------------------------------------------------------------------------------------
    def free(self, pool: int) -> int:
        """Bytes of ``pool`` free now."""
        return self.capacity[pool] - self.used[pool]

    def buffer_free(self) -> int:
        """Bytes of the transfer buffer free now."""
        return self.buffer_capacity - self.buffer_used

    def room_to_come(self, pool: int) -> int:
        """Bytes of ``pool`` free now or draining to the host, less what waiting prefetches claim."""
        return self.capacity[pool] - self.used[pool] + self.draining[pool] - self.claimed[pool]

    def take_room(self, u: Unit, allow_buffer: bool) -> bool:
        """Give ``u`` room that is free now: in its pool, else (with ``allow_buffer``) in the
        transfer buffer. False, changing nothing, if neither has it."""
        nbytes = u.nbytes
        pool = u.pool
        used = self.used
        if self.capacity[pool] - used[pool] >= nbytes:
            used[pool] += nbytes
        elif allow_buffer and self.buffer_capacity - self.buffer_used >= nbytes:
            u.in_buffer = True
            self.buffer_used += nbytes
        else:
            return False
        tot = self.total = self.total + nbytes
        if tot > self.peak:
            self.peak = tot
        return True

    def take_buffer(self, u: Unit) -> bool:
        """Give ``u`` room in the transfer buffer only. False if it has none."""
        if self.buffer_capacity - self.buffer_used < u.nbytes:
            return False
        u.in_buffer = True
        self.buffer_used += u.nbytes
        self.total += u.nbytes
        self._note_peak()
        return True

    def move_to_pool(self, u: Unit) -> bool:
        """Move a buffered unit into its pool if that has room now."""
        if self.capacity[u.pool] - self.used[u.pool] < u.nbytes:
            return False
        self.buffer_used -= u.nbytes
        self.used[u.pool] += u.nbytes
        u.in_buffer = False
        if self.tracked and u.state == RESIDENT:
            self.enlist(u)
        return True

    def release(self, u: Unit) -> None:
        """Free ``u``'s room at once."""
        if u.in_buffer:
            self.buffer_used -= u.nbytes
        else:
            self.used[u.pool] -= u.nbytes
        self.total -= u.nbytes

    def start_drain(self, u: Unit) -> None:
        """``u`` was evicted with swap-out: its room stays held until :meth:`end_drain`."""
        if u.in_buffer:
            self.buffer_draining += u.nbytes
        else:
            self.draining[u.pool] += u.nbytes

    def end_drain(self, u: Unit) -> None:
        """``u``'s copy back to the host landed: its room is free."""
        if u.in_buffer:
            self.buffer_draining -= u.nbytes
        else:
            self.draining[u.pool] -= u.nbytes
            if self.reserved[u.pool]:
                self._shrink(u.pool, u.nbytes)
        self.release(u)

    def _shrink(self, pool: int, nbytes: int) -> None:
        """``nbytes`` of ``pool`` landed on the host while it shrinks: its capacity falls by
        what it reserved, and that room goes to the pools owed some, in pool order."""
        take = min(nbytes, self.reserved[pool])
        self.reserved[pool] -= take
        self.claimed[pool] -= take
        self.capacity[pool] -= take
        owed = self.owed
        for p, due in enumerate(owed):
            if take == 0:
                break
            give = min(take, due)
            owed[p] -= give
            self.capacity[p] += give
            take -= give

    def claim(self, u: Unit) -> None:
        """A prefetch waits for draining room of its pool."""
        self.claimed[u.pool] += u.nbytes

    def unclaim(self, u: Unit) -> None:
        """The waiting prefetch got its room, or was withdrawn."""
        self.claimed[u.pool] -= u.nbytes

    def total_used(self) -> int:
        """Bytes held in all pools and the buffer."""
        return self.total

    def draining_any(self) -> bool:
        """Some room is still being copied back to the host."""
        return any(self.draining) or self.buffer_draining > 0

    def _note_peak(self) -> None:
        if self.total > self.peak:
            self.peak = self.total

    def set_capacities(self, capacities: list[int], total: int | None = None) -> None:
        """New pool sizes, summing to at most ``total`` bytes (default their sum). The caller
        checked that each pool's room held (not draining) and claimed fits its new size. A pool
        over its new size only by bytes still draining back to the host keeps that room,
        reserved as a claim, and shrinks as they land (:meth:`end_drain`); pools that grow wait
        for the room they would take from it, so that no more than ``total`` is ever held."""
        if any(self.reserved) or any(self.owed):   # a shrink still under way: start afresh
            for p, r in enumerate(self.reserved):
                self.claimed[p] -= r
            self.reserved = [0] * len(self.capacity)
            self.owed = [0] * len(self.capacity)
        caps = [int(c) for c in capacities]
        over = [max(0, u - c) for u, c in zip(self.used, caps, strict=True)]
        if any(over):
            short = sum(caps) + sum(over) - (sum(caps) if total is None else total)
            for p, c in enumerate(caps):   # the growing pools give up what is still draining
                cut = min(short, c - self.used[p]) if short > 0 and not over[p] else 0
                caps[p] -= cut
                self.owed[p] = cut
                short -= cut
            if short > 0:
                raise VramError(f"pools hold {sum(self.used)} bytes, over the total {total}")
            for p, o in enumerate(over):
                caps[p] += o
                self.reserved[p] = o
                self.claimed[p] += o
        self.capacity = caps
        self.check_room()

    def check(self) -> None:
        """The invariant (see the module docstring): :meth:`check_room`, and a tracked pool's
        victims are its resident units outside the buffer, and its units per layer its present
        units of that layer, in pool order. Raises :class:`VramError`."""
        self.check_room()
        by_layer: dict[int, list[UnitKey]] = {}
        if self.tracked:
            for k in self.units:
                by_layer.setdefault(k[0], []).append(k)
        kept = {layer: list(units) for layer, units in self.layer_units.items() if units}
        if kept != by_layer:
            raise VramError(f"units per layer {kept} are not the present units {by_layer}")
        for p, pool_units in enumerate(self.pool_units):
            want = [k for k, u in pool_units.items() if u.state == RESIDENT and not u.in_buffer] if self.tracked else []
            if self.victim_keys[p] != want or self.victim_seqs[p] != [pool_units[k].seq for k in want]:
                raise VramError(f"pool {p}: victims {self.victim_keys[p]} are not its resident units {want}")

    def check_room(self) -> None:
        """The invariant's bytes: no pool or buffer over its capacity, claims within draining
        room, and usage equal to the room held by present units plus what drains. Raises
        :class:`VramError`."""
        held = [0] * len(self.capacity)
        buf = 0
        for u in self.units.values():
            if u.state == WAITING:
                continue   # a waiting prefetch holds a claim, not room
            if u.in_buffer:
                buf += u.nbytes
            else:
                held[u.pool] += u.nbytes
        for p, cap in enumerate(self.capacity):
            if self.used[p] > cap:
                raise VramError(f"pool {p} holds {self.used[p]} bytes, over its {cap}")
            if self.claimed[p] > self.draining[p] or self.claimed[p] < self.reserved[p] or self.reserved[p] < 0:
                raise VramError(f"pool {p} claims {self.claimed[p]} of {self.draining[p]} draining bytes")
            if held[p] + self.draining[p] != self.used[p]:
                raise VramError(f"pool {p}: units hold {held[p]} + draining {self.draining[p]} != used {self.used[p]}")
        if self.buffer_used > self.buffer_capacity:
            raise VramError(f"buffer holds {self.buffer_used} bytes, over its {self.buffer_capacity}")
        if self.total != sum(self.used) + self.buffer_used:
            raise VramError(f"running total {self.total} != pools {sum(self.used)} + buffer {self.buffer_used}")
        if buf + self.buffer_draining != self.buffer_used:
            raise VramError(f"buffer: units hold {buf} + draining {self.buffer_draining} != used {self.buffer_used}")
