"""The policy interface: hooks the engine calls, and what a policy may see and do.

A policy is a small class whose parameters are its ``__init__`` keywords. The engine calls its
hooks in this order (DESIGN.md section 5)::

    policy.setup(ctx)                                  # once, before time 0
    for each iteration (a decode step of the batch, or one request's prefill):
        policy.on_iteration_start(view)
        for layer l in 0..L-1:
            policy.before_layer(view, l)               # may evict / prefetch / cancel queued prefetches
            <non-MoE compute of layer l on the GPU stream>
            plan = policy.plan(view, l, routing)       # routing of l is known now; None = run as routed
            <hits compute, misses load on demand (victims from policy.choose_victim)>
            policy.after_layer(view, l, outcome)       # prefetch for l+1.., update state
        policy.on_iteration_end(view)                  # an idle point: budgets may change here

Between hooks, the engine calls ``choose_victim(view, pool, candidates, need_bytes)`` whenever a
transfer needs room, ``on_loaded(view, unit, demand)`` when a transfer lands, ``admit(view,
unit)`` when a unit in the transfer buffer has been used by its layer, and ``on_evict(view,
unit)`` for every unit that leaves VRAM (whoever asked for it), and ``on_cancel(view, unit)``
for every prefetch withdrawn before its transfer started.

What a policy sees goes through ``view`` (:class:`sim.engine.EngineView`), which refuses reads
of the future (a later layer's routing, a later iteration). Only classes with ``oracle = True``
receive the annotation of future accesses in ``ctx.future``; they are labelled as bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.engine import EngineView, SimContext

UnitKey = tuple[int, int, int]
"""(layer, expert, part). ``part`` 0 is the whole expert unless the policy splits experts
into segments (MoEpic: part 0 = top segment, part 1 = bottom segment)."""


@dataclass(frozen=True, slots=True)
class Routing:
    """What the router of one layer decided for the tokens of the current iteration.

    ``experts`` is ``[n_tokens, top_k]`` (highest probability first); ``weights`` the router
    probabilities of those experts, or ``None`` when the trace has none.
    """

    layer: int
    experts: np.ndarray
    weights: np.ndarray | None

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])


@dataclass(slots=True)
class Outcome:
    """What happened at one layer, given to ``after_layer``.

    ``experts`` lists the executed experts in access order (tokens in order, each token's
    experts highest probability first, first occurrence); ``status`` holds for each one of
    ``HIT``, ``LATE``, ``PARTIAL`` or ``MISS`` as seen when the routing became known.
    ``plan`` is the ``[n_tokens, k]`` matrix of experts that ran (-1 = dropped).
    """

    layer: int
    routing: Routing
    plan: np.ndarray
    experts: list[int]
    status: list[int]


HIT, LATE, PARTIAL, MISS = 0, 1, 2, 3
STATUS_NAMES = ("hit", "late", "partial", "miss")


class Policy:
    """Base class of every policy. Subclasses set ``name`` and override hooks they need.

    Class attributes:
      * ``name``: registry key.
      * ``oracle``: reads the future (only through ``ctx.future``); reported as a bound.
      * ``lossy``: may change which experts run (substitution, dropping, commit).
      * ``scope``: ``"layer"`` (the budget is split into one pool per layer, the default) or
        ``"global"`` (one pool for all layers). A policy may also set per-layer budgets of its
        own with ``view.set_layer_budgets`` at an idle point.
    """

    name: ClassVar[str] = ""
    oracle: ClassVar[bool] = False
    lossy: ClassVar[bool] = False
    scope: ClassVar[str] = "layer"
    summary: ClassVar[str] = ""

    # -- parameters -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """The ``__init__`` keywords and their current values (scikit-learn style)."""
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {
            p.name: getattr(self, p.name)
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    # -- hooks ------------------------------------------------------------------------------
    def setup(self, ctx: SimContext) -> None:
        """Called once before the simulation starts, with the static context."""

    def part_fractions(self, layer: int) -> tuple[float, ...]:
        """How this policy splits an expert of ``layer`` into parts (fractions of its bytes,
        summing to 1). Default: one part, the whole expert."""
        return (1.0,)

    def warm(self, view: EngineView, units: list[UnitKey]) -> None:
        """The engine placed ``units`` in VRAM before time 0 (``cache.initial``)."""

    def on_iteration_start(self, view: EngineView) -> None:
        """A new iteration begins (its tokens, phase and embedding are in ``view.iteration``)."""

    def before_layer(self, view: EngineView, layer: int) -> None:
        """Before the non-MoE compute of ``layer``; routing of ``layer`` is not known yet."""

    def plan(self, view: EngineView, layer: int, routing: Routing) -> np.ndarray | None:
        """Which experts run: a ``[n_tokens, k]`` int matrix (-1 = dropped), or ``None`` to run
        the routing as recorded. Lossless policies keep the default."""
        return None

    def after_layer(self, view: EngineView, layer: int, outcome: Outcome) -> None:
        """After the experts of ``layer`` were planned and their loads issued."""

    def on_iteration_end(self, view: EngineView) -> None:
        """The iteration finished; an idle point."""

    def choose_victim(
        self, view: EngineView, pool: int, candidates: list[UnitKey], need_bytes: int
    ) -> UnitKey | None:
        """Pick one of ``candidates`` (unpinned residents of ``pool``) to evict so that a
        transfer needing ``need_bytes`` can start, or ``None`` to refuse (the transfer then
        waits, or a prefetch is dropped). Default: the first candidate."""
        return candidates[0] if candidates else None

    def admit(self, view: EngineView, unit: UnitKey) -> bool:
        """A unit that landed in the transfer buffer (``cache.buffer_experts``) was used by its
        layer: keep it, moving it into its pool (victims from ``choose_victim``), or drop it
        (False). Default: keep it when room can be made."""
        return True

    def on_evict(self, view: EngineView, unit: UnitKey) -> None:
        """``unit`` left VRAM."""

    def on_cancel(self, view: EngineView, unit: UnitKey) -> None:
        """A prefetch of ``unit`` was withdrawn before its transfer started (by the policy, by
        the engine to make room for a demand load, or because its layer was routed while it
        still waited for room); it holds no room any more and was never resident."""

    def on_loaded(self, view: EngineView, unit: UnitKey, demand: bool) -> None:
        """The transfer of ``unit`` completed (``demand`` tells demand load from prefetch)."""
