"""Withdrawing and aborting prefetches: the part of :class:`~moesim.sim.engine.transfers.Transfers`
that takes back copies a policy issued.

A queued prefetch can be withdrawn (``cancel_prefetches``, or for room a waiting demand load
needs) or re-prioritised; one waiting for draining room (``swap_out``) holds a claim and gives it
up; one in flight can be aborted, keeping the books of the bytes it moved. Under fifo order
nothing issued to a lane is taken back. Every withdrawal calls the policy's ``on_cancel``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moesim.policies.contract.base import ABSENT, INFLIGHT, RESIDENT, WAITING, UnitKey
from moesim.sim.engine.lanes import PREFETCH_CLASS
from moesim.sim.engine.vram import Unit

if TYPE_CHECKING:  # pragma: no cover
    from moesim.policies.contract.base import Policy, View
    from moesim.sim.engine.records import RunStats, TimelineEvent
    from moesim.sim.engine.vram import Vram


class Withdrawals:
    """Withdraw, re-prioritise and abort prefetches (see the module docstring); mixed into
    :class:`~moesim.sim.engine.transfers.Transfers`, whose state these methods use."""

    vram: Vram
    lanes: Any
    policy: Policy
    view: View
    stats: RunStats
    record_timeline: bool
    timeline: list[TimelineEvent]
    waiting_prefetch: list[tuple[Unit, float]]
    wake: Callable[[], None]             # Transfers.wake: room was freed
    _label: Callable[[UnitKey], str]     # Transfers._label: a transfer's name on the timeline

    def reprioritize(self, key: UnitKey, priority: float) -> bool:
        """A policy changes a queued prefetch's priority."""
        u = self.vram.units.get(key)
        if u is None or u.demand:
            return False
        if u.state == WAITING:
            if not self.lanes.can_withdraw:
                return False
            self.waiting_prefetch = [(w, priority if w is u else p) for w, p in self.waiting_prefetch]
            return True
        ok: bool = self.lanes.reprioritize(u, priority)
        return ok

    def _drop_queued(self, keep: Callable[[Unit], bool]) -> int:
        """Withdraw queued prefetches for which ``keep`` is False; never a demand load, never a
        pinned unit. Under fifo order nothing issued to a lane can be withdrawn, but a prefetch
        still waiting for draining room has not been issued: it holds a claim, and gives it up."""
        vram = self.vram
        pinned = vram.pinned
        dropped = (self.lanes.cancel(lambda u, cls: cls != PREFETCH_CLASS or u.key in pinned or keep(u))
                   if self.lanes.can_withdraw else [])
        for u in dropped:
            u.state = ABSENT
            vram.remove(u)
            vram.release(u)
        if dropped:
            self.wake()
        if self.waiting_prefetch:   # they hold no room yet, only a claim
            left = []
            for u, prio in self.waiting_prefetch:
                if u.key in pinned or keep(u):
                    left.append((u, prio))
                else:
                    self._withdraw(u)
                    dropped.append(u)
            self.waiting_prefetch = left
        for u in dropped:
            self.policy.on_cancel(self.view, u.key)
        return len(dropped)

    def _withdraw(self, u: Unit) -> None:
        """Forget a prefetch waiting for draining room (the caller takes it off the list)."""
        u.state = ABSENT
        self.vram.remove(u)
        self.vram.unclaim(u)

    def demand_instead(self, u: Unit) -> None:
        """A prefetch still waiting for draining room when its layer is routed: withdraw it;
        the caller loads the unit on demand."""
        self.waiting_prefetch = [x for x in self.waiting_prefetch if x[0] is not u]
        self._withdraw(u)
        self.policy.on_cancel(self.view, u.key)

    def _awaited(self, u: Unit) -> bool:
        """Something (the GPU stream, under ``pcie.sync_prefetch``) waits for ``u`` to land."""
        ev = u.event
        if ev is None or ev.callbacks is None:   # no landing event, or one already processed
            return False
        if u.state == INFLIGHT:
            flight = self.lanes.flight(u)
            if flight is not None and ev is flight[3]:
                return len(ev.callbacks) > 1   # the lane's own callback, then any waiter's
        return bool(ev.callbacks)

    def abort_prefetch(self, key: UnitKey) -> bool:
        """A policy stops a prefetch that has not landed (see :meth:`EngineView.abort_prefetch`).
        Waiting for draining room or queued: withdrawn, nothing moved. In flight: the copy stops
        now; its lane frees at once for the next queued transfer; the bytes it moved (the
        elapsed share of its duration) count as transferred and wasted, the rest is taken off
        the run's prefetch (and refetch) bytes; the lane's busy time is the time it ran. Either
        way its room (pool or transfer buffer) is released at once and the policy's
        ``on_cancel`` is called. False, changing nothing, for a unit that is absent, resident,
        a demand load, pinned, awaited by the GPU stream, or issued under fifo order."""
        vram = self.vram
        u = vram.units.get(key)
        if u is None or u.demand or u.state == RESIDENT or key in vram.pinned or self._awaited(u):
            return False
        if u.state == WAITING:   # not issued yet: it holds a claim, not room
            self.waiting_prefetch = [x for x in self.waiting_prefetch if x[0] is not u]
            self._withdraw(u)
        elif not self.lanes.can_withdraw:
            return False
        else:
            if u.state == INFLIGHT:
                self._stop_flight(u)
            u.state = ABSENT   # a queued one: the lanes skip its queue entry when it comes up
            vram.remove(u)
            vram.release(u)
            self.wake()
        self.policy.on_cancel(self.view, key)
        return True

    def _stop_flight(self, u: Unit) -> None:
        """Abort ``u``'s copy in flight and keep the books of what it moved."""
        flight = self.lanes.flight(u)
        assert flight is not None
        lane, start, dur, _ = flight
        ran = self.lanes.abort(u)
        moved = min(u.nbytes, int(round(u.nbytes * ran / dur))) if dur > 0 else u.nbytes
        st = self.stats
        st.prefetch_bytes -= u.nbytes - moved
        if u.refetched:
            st.refetch_bytes -= u.nbytes - moved
        st.pcie_busy_s += ran
        st.aborted_prefetches += 1
        st.aborted_bytes += moved
        st.wasted_prefetch_bytes += moved
        if self.record_timeline:
            self.timeline.append((f"PCIe H2D {lane}", self._label(u.key), start, ran,
                                  {"demand": False, "bytes": moved, "aborted": True}))

    def cancel_queued(self, layer: int | None) -> int:
        """Withdraw queued prefetches of ``layer`` (all layers if None)."""
        return self._drop_queued(lambda u: layer is not None and u.key[0] != layer)

    def cancel_queued_pool(self, pool: int) -> int:
        """Withdraw queued prefetches holding room in ``pool`` (not in the buffer), so that a
        waiting demand load can take it."""
        if not self.lanes.queue and not self.waiting_prefetch:
            return 0   # nothing queued to withdraw (often, while demand loads wait for room)
        return self._drop_queued(lambda u: u.pool != pool or u.in_buffer)
