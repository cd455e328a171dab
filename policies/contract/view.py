"""The :class:`View`: what a policy may see and do at a hook, only about the present and the
past (the engine and the executor implement it; reads ahead of routing raise
:class:`~moesim.policies.contract.base.CausalityError`), and :class:`IterationInfo`, the current
iteration as the view describes it. :mod:`moesim.policies.contract.base` re-exports them all.

The view is three narrower protocols joined, and each hook is annotated with what it may use,
so that mypy holds a policy to it (the engine hands the same object to every hook: nothing
changes at run time):

* :class:`RoutingView`: time, position, and the routing, logits, lookahead and embeddings of
  the present and the past;
* :class:`ResidencyView`: what is resident or on its way, pins, pools and free room;
* :class:`ActionView`: the few actions (prefetch, reprioritize, evict, cancel, abort, re-split
  budgets, spend CPU time).

:class:`ReadView` (routing and residency, no action) is what the hooks get that the engine calls
while it is making room or recording a departure (``choose_victim``, ``admit``, ``on_evict``,
``on_cancel``): they answer or take note, the engine acts. Every other hook gets the whole
:class:`View`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from moesim.policies.contract.hook_data import Routing, UnitKey


class IterationInfo(Protocol):
    """The iteration being replayed."""

    index: int
    phase: int              # 0 prefill, 1 decode
    request_ids: np.ndarray  # per token
    batch: int

    @property
    def n_tokens(self) -> int:
        """Tokens in the iteration."""
        ...

    @property
    def phase_name(self) -> str:
        """``prefill`` or ``decode``."""
        ...


class RoutingView(Protocol):
    """What a policy may read of the run: time, position, and the routing of the present and
    the past. Reads of a layer's routing, logits or lookahead before that layer is routed raise
    :class:`~moesim.policies.contract.base.CausalityError`."""

    # -- time and position
    @property
    def now(self) -> float:
        """Simulated time in seconds."""
        ...

    @property
    def iteration(self) -> IterationInfo:
        """The current iteration."""
        ...

    @property
    def iteration_index(self) -> int:
        """Index of the current iteration."""
        ...

    @property
    def layer(self) -> int:
        """The layer being processed (-1 before layer 0, L after the last)."""
        ...

    @property
    def num_layers(self) -> int:
        """MoE layers of the model."""
        ...

    # -- present and past routing
    def routing(self, layer: int) -> Routing:
        """Routing of ``layer`` in the current iteration, once it is known."""
        ...

    def logits(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` router logits of ``layer``, once it is routed (None without them)."""
        ...

    def probs(self, layer: int) -> np.ndarray | None:
        """The row-wise softmax of :meth:`logits` (float32 at least: the numbers
        :func:`~moesim.policies.parts.predictors.softmax_rows` gives), or None without them;
        possibly read-only: read it, do not write into it."""
        ...

    def lookahead_logits(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` logits of router ``layer + 1`` (router 0 at the last layer) on the
        router input of ``layer``, once ``layer`` is routed (None without them)."""
        ...

    def lookahead_probs(self, layer: int) -> np.ndarray | None:
        """The row-wise softmax of :meth:`lookahead_logits` (float32 at least: the numbers
        :func:`~moesim.policies.parts.predictors.softmax_rows` gives), or None without them;
        possibly read-only: read it, do not write into it."""
        ...

    def previous_lookahead_logits(self) -> np.ndarray | None:
        """The last layer's lookahead of the previous iteration (a cross-token prediction of
        layer 0), or None."""
        ...

    def previous_routing(self, layer: int) -> np.ndarray | None:
        """``[n_tokens, k]`` routing of ``layer`` in the previous iteration, or None."""
        ...

    def embedding(self) -> np.ndarray | None:
        """Embedding of the current iteration (its first token's row), or None."""
        ...

    def embeddings(self) -> np.ndarray | None:
        """``[n_requests, h]`` embedding of each request's part of the iteration (in the order
        of ``dict.fromkeys(iteration.request_ids)``), or None."""
        ...



class ResidencyView(Protocol):
    """What is resident or on its way to VRAM, what is pinned, and where there is room."""

    def state(self, layer: int, expert: int, part: int = 0) -> int:
        """``ABSENT``, ``WAITING``, ``QUEUED``, ``INFLIGHT`` or ``RESIDENT``."""
        ...

    def is_resident(self, layer: int, expert: int) -> bool:
        """Every part of the expert is resident."""
        ...

    def is_present(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit is resident or issued."""
        ...

    def resident_units(self, pool: int | None = None) -> list[UnitKey]:
        """Resident units (of ``pool``, or all)."""
        ...

    def units_of_layer(self, layer: int, in_transit: bool = False) -> list[UnitKey]:
        """Units of ``layer`` resident or issued (not those draining to the host), in pool
        order; with ``in_transit``, only those issued and not landed (waiting, queued or in
        flight)."""
        ...

    def pinned(self, layer: int, expert: int) -> bool:
        """Some part of the expert is planned for the current layer and not yet computed."""
        ...

    def pool_of(self, layer: int) -> int:
        """The pool that holds ``layer``'s units."""
        ...

    def capacity(self, pool: int) -> int:
        """Bytes of ``pool``."""
        ...

    def used(self, pool: int) -> int:
        """Bytes of ``pool`` held (resident, issued or draining)."""
        ...

    def free(self, pool: int) -> int:
        """Bytes of ``pool`` free now."""
        ...

    def draining(self, pool: int) -> int:
        """Bytes of ``pool`` being copied back to the host (``cache.swap_out``)."""
        ...

    def part_bytes(self, layer: int, part: int = 0) -> int:
        """Bytes of one part of an expert of ``layer``."""
        ...

    def buffer_free(self) -> int:
        """Free bytes in the transfer buffer."""
        ...

    def in_buffer(self, layer: int, expert: int, part: int = 0) -> bool:
        """The unit holds room in the transfer buffer rather than in its pool."""
        ...



class ReadView(RoutingView, ResidencyView, Protocol):
    """Routing and residency, no action: the view of the hooks the engine calls while it makes
    room or records a departure (``choose_victim``, ``admit``, ``on_evict``, ``on_cancel``)."""


class ActionView(Protocol):
    """The few things a policy may do: each keeps every VRAM and copy-lane rule (an action
    that would break one does nothing and says so)."""

    def prefetch(self, layer: int, expert: int, part: int = 0, priority: float = 0.0,
                 into_buffer: bool = False) -> bool:
        """Issue a prefetch; False (doing nothing) when it is present or gets no room."""
        ...

    def reprioritize(self, layer: int, expert: int, part: int = 0, priority: float = 0.0) -> bool:
        """Change the priority of a queued prefetch (``pcie.order: priority`` only)."""
        ...

    def evict(self, layer: int, expert: int, part: int = 0) -> bool:
        """Drop a resident, unpinned unit; False if it is not one."""
        ...

    def cancel_prefetches(self, layer: int | None = None) -> int:
        """Withdraw queued prefetches (of ``layer``, or all); how many. None under fifo order."""
        ...

    def abort_prefetch(self, layer: int, expert: int, part: int = 0) -> bool:
        """Stop a prefetch that has not landed: withdrawn if queued (or waiting for draining
        room); if in flight, the copy stops now and its lane frees at once (the bytes moved so
        far count as transferred and wasted). Its room is released at once and ``on_cancel``
        follows. False, doing nothing, for a unit absent, resident, loaded on demand, pinned,
        awaited by the GPU stream, or issued under ``pcie.order: fifo``."""
        ...

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the budget among layers (bytes), at an idle point, each layer's held and
        claimed bytes fitting its new budget (evict first); bytes still draining back to the
        host leave as they land, and a growing layer gets that room then."""
        ...

    def spend_cpu(self, seconds: float) -> None:
        """Charge policy computation on the critical path (the GPU stream waits for it)."""
        ...


class View(ReadView, ActionView, Protocol):
    """What a policy may see and do, only about the present and the past (the three protocols
    joined): the view of every hook but those of :class:`ReadView`."""
