"""The causal, read-mostly view a policy gets of a run's :class:`~moesim.sim.engine.state.RunState`
(it implements :class:`moesim.policies.contract.base.View`), in the simulator and in the real
executor alike.

Reads are limited to the present and the past: the routing, logits and lookahead of layers
already routed in the current iteration, earlier iterations, and the residency of units.
A read of a layer not yet routed raises :class:`~moesim.policies.contract.base.CausalityError`.
Actions (prefetch, evict, cancel, abort, re-split budgets) go to the state's ``transfers`` (the
event loop's :class:`~moesim.sim.engine.transfers.Transfers`, or the executor's real copies),
which keep every VRAM and lane rule; CPU time spent waits in the state for the next charge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import ABSENT, RESIDENT, CausalityError, Routing, UnitKey
from moesim.policies.parts.predictors import softmax_rows

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine.state import RunState
    from moesim.sim.engine.workload import Iteration

PROBS_BLOCK = 256   # trace rows whose softmax :meth:`EngineView.probs` / ``lookahead_probs`` make at once


class EngineView:
    """What a policy may see and do (see :class:`moesim.policies.contract.base.View`), over the
    run's state ``_e``."""

    __slots__ = ("_e", "_units", "_blocks")

    def __init__(self, state: RunState[Any]) -> None:
        self._e = state
        self._units = state.vram.units   # the run's units by key (one dict for the whole run)
        # per source of logits (0: the trace's ``logits``, 1: its ``lookahead_logits``), the
        # softmax of a block of its rows and the first row of that block, or None (_row_probs)
        self._blocks: list[tuple[np.ndarray, int] | None] = [None, None]

    # -- time and position ---------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Simulated time in seconds."""
        return self._e.now()

    @property
    def iteration(self) -> Iteration:
        """The current iteration."""
        return self._e.cur_iter

    @property
    def iteration_index(self) -> int:
        """Index of the current iteration."""
        return self._e.cur_iter.index

    @property
    def layer(self) -> int:
        """The layer being processed (-1 before layer 0 of the iteration, L after the last)."""
        return self._e.cur_layer

    @property
    def num_layers(self) -> int:
        """MoE layers of the model."""
        return self._e.L

    # -- present and past routing ---------------------------------------------------------------
    def _known(self, layer: int, what: str) -> None:
        e = self._e
        if layer > e.routed_upto:
            raise CausalityError(f"{what} of layer {layer} is not known yet (now at layer {e.cur_layer})")

    def routing(self, layer: int) -> Routing:
        """Routing of ``layer`` in the current iteration, once it is known."""
        self._known(layer, "routing")
        e = self._e
        return e.routing_of(e.cur_iter, layer)

    def logits(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` router logits of ``layer``, once it is routed."""
        self._known(layer, "logits")
        e = self._e
        lg = e.trace.logits
        return None if lg is None else lg[e.rows_of(e.cur_iter, layer)]

    def _lookahead_of(self, layer: int) -> np.ndarray | None:
        """The trace's lookahead logits (all rows), or None; raises before ``layer`` is routed."""
        e = self._e
        if layer > e.routed_upto:
            self._known(layer, "lookahead")   # raises
        return e.trace.lookahead_logits

    def lookahead_logits(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` logits of router ``layer + 1`` (router 0 at the last layer) on the
        router input of ``layer``, once ``layer`` is routed."""
        la = self._lookahead_of(layer)
        if la is None:
            return None
        rows0 = self._e.cur_iter.rows0
        if rows0.shape[0] == 1:   # e.rows_of(e.cur_iter, layer), inlined: once per layer
            r = int(rows0[0]) + layer
            row: np.ndarray = la[r:r + 1]
            return row
        rows: np.ndarray = la[rows0 + layer]
        return rows

    def lookahead_probs(self, layer: int) -> np.ndarray | None:
        """``softmax_rows(lookahead_logits(layer))``, made as :meth:`probs` makes its rows."""
        return self._row_probs(self._lookahead_of(layer), 1, layer)

    def probs(self, layer: int) -> np.ndarray | None:
        """``softmax_rows(logits(layer))`` (:func:`~moesim.policies.parts.predictors.softmax_rows`),
        the same numbers; read it, do not write into it. One token's row is a row of the softmax
        of a block of :data:`PROBS_BLOCK` trace rows from it, made once: a row's softmax is the
        same bytes alone or in a block (max, exp and division are per element; each row's sum
        is its own pairwise sum either way; checked on every row of a trace and on random blocks
        in ``tests/test_view_probs.py``)."""
        self._known(layer, "logits")
        return self._row_probs(self._e.trace.logits, 0, layer)

    def _row_probs(self, src: np.ndarray | None, which: int, layer: int) -> np.ndarray | None:
        """The softmax of the current iteration's rows of ``layer`` in ``src`` (a trace array of
        logits, or None; ``which``: its slot in ``_blocks``), one token's from the block of
        ``src`` that holds its row."""
        if src is None:
            return None
        rows0 = self._e.cur_iter.rows0
        if rows0.shape[0] != 1:
            return softmax_rows(src[rows0 + layer])
        r = int(rows0[0]) + layer
        got = self._blocks[which]
        if got is None or not 0 <= r - got[1] < got[0].shape[0]:
            block = softmax_rows(src[r:r + PROBS_BLOCK])
            block.flags.writeable = False
            got = self._blocks[which] = (block, r)
        i = r - got[1]
        return got[0][i:i + 1]

    def previous_lookahead_logits(self) -> np.ndarray | None:
        """Lookahead of the last layer of the previous iteration: a cross-token prediction of
        layer 0, known at the start of an iteration (its batch may differ in size)."""
        e = self._e
        la = e.trace.lookahead_logits
        if la is None or e.prev_iter is None:
            return None
        return la[e.rows_of(e.prev_iter, e.L - 1)]

    def previous_routing(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, k]`` routing of ``layer`` in the previous iteration."""
        e = self._e
        if e.prev_iter is None:
            return None
        return e.trace.experts[e.rows_of(e.prev_iter, layer)]

    def embedding(self) -> np.ndarray | None:
        """Embedding of the current iteration (its first token's row), if the trace has one."""
        e = self._e
        it = e.cur_iter
        if it.emb_row < 0 or e.trace.embedding is None or e.emb_index is None:
            return None
        idx = e.emb_index.get(it.emb_row)
        return None if idx is None else e.trace.embedding[idx]

    def embeddings(self) -> np.ndarray | None:
        """``[n_requests, h]``: for each request of the iteration (in first-appearance order) the
        embedding on its first token's layer-0 row; None if the trace has none there."""
        e = self._e
        if e.trace.embedding is None or e.emb_index is None:
            return None
        it = e.cur_iter
        seen: dict[int, int] = {}
        for row, r in zip(it.rows0.tolist(), it.request_ids.tolist(), strict=True):
            seen.setdefault(int(r), int(row))
        idx = [e.emb_index.get(row) for row in seen.values()]
        if any(i is None for i in idx):
            return None
        return e.trace.embedding[np.asarray(idx, dtype=np.int64)]

    # -- residency ------------------------------------------------------------------------------
    def state(self, layer: int, expert: int, part: int = 0) -> int:
        """``ABSENT``, ``WAITING``, ``QUEUED``, ``INFLIGHT`` or ``RESIDENT``."""
        u = self._units.get((layer, expert, part))
        return ABSENT if u is None else u.state

    def is_resident(self, layer: int, expert: int) -> bool:
        """All parts of the expert are resident."""
        e = self._e
        units = e.vram.units
        for p in range(len(e.fractions[layer])):
            u = units.get((layer, expert, p))
            if u is None or u.state != RESIDENT:
                return False
        return True

    def is_present(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit is resident or issued (waiting, queued, in flight)."""
        return (layer, expert, part) in self._units

    def resident_units(self, pool: int | None = None) -> list[UnitKey]:
        """Resident units, of ``pool`` or of all pools."""
        v = self._e.vram
        src = v.units.items() if pool is None else v.pool_units[pool].items()
        return [k for k, u in src if u.state == RESIDENT]

    def units_of_layer(self, layer: int, in_transit: bool = False) -> list[UnitKey]:
        """Units of ``layer`` resident or issued, in pool order; with ``in_transit``, only
        those not landed."""
        units = self._e.vram.units_of(layer)
        if in_transit:
            return [k for k, u in units.items() if u.state != RESIDENT]
        return list(units)

    def pinned(self, layer: int, expert: int) -> bool:
        """Some part of the expert is pinned: planned for the current layer, not yet computed."""
        pins = self._e.vram.pinned
        if not pins:
            return False
        for p in range(len(self._e.fractions[layer])):   # noqa: SIM110 - a plain loop: no generator to make
            if (layer, expert, p) in pins:
                return True
        return False

    def pool_of(self, layer: int) -> int:
        """The pool holding ``layer``'s units."""
        return self._e.pool_of(layer)

    def capacity(self, pool: int) -> int:
        """Bytes of ``pool``."""
        return self._e.vram.capacity[pool]

    def used(self, pool: int) -> int:
        """Bytes of ``pool`` held (resident, issued or draining)."""
        return self._e.vram.used[pool]

    def free(self, pool: int) -> int:
        """Bytes of ``pool`` free now."""
        return self._e.vram.free(pool)

    def draining(self, pool: int) -> int:
        """Bytes of ``pool`` still being copied back to the host."""
        return self._e.vram.draining[pool]

    def part_bytes(self, layer: int, part: int = 0) -> int:
        """Bytes of one part of an expert of ``layer``."""
        return self._e.part_bytes(layer, part)

    def buffer_free(self) -> int:
        """Free bytes in the transfer buffer (``cache.buffer_experts``)."""
        return self._e.vram.buffer_free()

    def in_buffer(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit is present and holds room in the transfer buffer rather than in its pool."""
        u = self._units.get((layer, expert, part))
        return u is not None and u.in_buffer

    # -- actions --------------------------------------------------------------------------------
    def prefetch(self, layer: int, expert: int, part: int = 0, priority: float = 0.0,
                 into_buffer: bool = False) -> bool:
        """Issue a prefetch (behind every demand load under ``pcie.order: priority``; higher
        ``priority`` first). It takes room now: from its pool (victims from ``choose_victim``),
        or the transfer buffer when ``into_buffer`` or the pool has none. False, doing nothing,
        when the unit is already present or gets no room."""
        ok: bool = self._e.transfers.issue_prefetch((layer, expert, part), priority, into_buffer)
        return ok

    def reprioritize(self, layer: int, expert: int, part: int = 0, priority: float = 0.0) -> bool:
        """Give a queued prefetch a new priority; False if it is not queued (or under fifo)."""
        ok: bool = self._e.transfers.reprioritize((layer, expert, part), priority)
        return ok

    def evict(self, layer: int, expert: int, part: int = 0) -> bool:
        """Drop a resident, unpinned unit. False if it is not such a unit."""
        ok: bool = self._e.transfers.evict_key((layer, expert, part))
        return ok

    def cancel_prefetches(self, layer: int | None = None) -> int:
        """Withdraw queued (not yet started) prefetches, of ``layer`` or all; how many (always
        0 under ``pcie.order: fifo``, where issued copies cannot be withdrawn)."""
        n: int = self._e.transfers.cancel_queued(layer)
        return n

    def abort_prefetch(self, layer: int, expert: int, part: int = 0) -> bool:
        """Stop a prefetch of the unit that has not landed: withdrawn if it waits or is queued;
        if in flight, the copy stops now, its lane frees at once, the bytes it moved (the
        elapsed share of its duration) count as transferred and wasted. Its room is released
        at once; ``on_cancel`` follows. False, doing nothing, if the unit is absent, resident,
        a demand load, pinned, awaited by the GPU stream (``pcie.sync_prefetch``), or issued
        under ``pcie.order: fifo``."""
        ok: bool = self._e.transfers.abort_prefetch((layer, expert, part))
        return ok

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the expert budget among layers (bytes per layer; the sum may not exceed the
        total), at an idle point and only when each layer's held and claimed bytes fit its new
        budget (evict first). Bytes still draining back to the host (``cache.swap_out``) do not
        count: a layer over its new budget by them shrinks as they land, and the layers that
        grow get that room then (never more than the total is held)."""
        self._e.transfers.set_layer_budgets(budgets)

    def spend_cpu(self, seconds: float) -> None:
        """Charge ``seconds`` of policy computation on the critical path (the GPU stream waits
        for it at the next hook boundary)."""
        if seconds < 0:
            raise ValueError(f"spend_cpu needs seconds >= 0, got {seconds}")
        self._e.spent_s += seconds
