"""What passes between the engine and a policy at a hook: the key of a unit, its residency and
an access's status, the layer's :class:`Routing`, the policy's :class:`Plan`, the
:class:`Outcome` of the accesses, and an :class:`EvictionRequest` with its answer (a victim or a
:class:`Decline`). Plain data, no behaviour; :mod:`moesim.policies.contract.base` states when each is
handed over and re-exports every name here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UnitKey = tuple[int, int, int]
"""(layer, expert, part). ``part`` 0 is the whole expert unless the policy splits experts into
segments (MoEpic: part 0 = top segment, part 1 = bottom segment)."""

# Residency of a unit, as :meth:`View.state` reports it.
ABSENT, WAITING, QUEUED, INFLIGHT, RESIDENT = 0, 1, 2, 3, 4
"""``ABSENT``: not in VRAM; ``WAITING``: issued, waiting for room still being copied back to the
host; ``QUEUED``: holds its room, its transfer has not started; ``INFLIGHT``: being copied;
``RESIDENT``: in VRAM."""

# Status of one access, as :class:`Outcome` reports it.
HIT, LATE, PARTIAL, MISS = 0, 1, 2, 3
STATUS_NAMES = ("hit", "late", "partial", "miss")


@dataclass(frozen=True, slots=True)
class Routing:
    """What the router of one layer decided for the tokens of the current iteration.

    ``experts`` is ``[n_tokens, top_k]`` (highest probability first); ``weights`` the router
    probabilities of those experts (softmax over all E, not renormalised), or ``None`` when the
    trace has none.
    """

    layer: int
    experts: np.ndarray
    weights: np.ndarray | None

    @property
    def n_tokens(self) -> int:
        """Tokens in the iteration."""
        return int(self.experts.shape[0])


@dataclass(frozen=True, slots=True)
class Plan:
    """What runs at one layer, per token slot: ``experts`` ``[n_tokens, k]`` (-1 = dropped; an id
    other than the routed one = substituted). ``on_cpu`` (same shape, optional) marks slots
    computed on the CPU instead of loading the expert (Fiddler, llama.cpp ``--n-cpu-moe``).
    ``weights`` (optional) are the combination weights the slots run with, for the quality
    harness; the simulator's timing does not depend on them. ``k`` may be smaller than the
    routing's top-k (dynamic top-k) or larger (a policy that runs more experts).
    ``wait_for`` names experts of the layer, none of which any slot runs, whose copies the
    policy has issued (``view.prefetch``) and which the layer waits for before it ends: a
    runtime that copies a whole expert tensor to run any part of it (llama.cpp's op offload of
    large batches before its PR #15346, accelerate's streaming of a whole decoder layer)."""

    experts: np.ndarray
    on_cpu: np.ndarray | None = None
    weights: np.ndarray | None = None
    wait_for: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        ex = np.asarray(self.experts)
        if ex.ndim != 2:
            raise ValueError(f"a plan is [n_tokens, k]; got shape {ex.shape}")
        if self.on_cpu is not None and np.shape(self.on_cpu) != ex.shape:
            raise ValueError(f"plan.on_cpu has shape {np.shape(self.on_cpu)}, experts {ex.shape}")
        if self.weights is not None and np.shape(self.weights) != ex.shape:
            raise ValueError(f"plan.weights has shape {np.shape(self.weights)}, experts {ex.shape}")


@dataclass(slots=True)
class Outcome:
    """What happened at one layer, given to ``on_access``, ``after_layer``.

    ``experts`` lists the experts that run on the GPU in access order (tokens in order, each
    token's experts highest probability first, first occurrence); ``status`` holds for each one
    ``HIT``, ``LATE``, ``PARTIAL`` or ``MISS``, as seen when the routing became known.
    ``cpu_experts`` lists those computed on the CPU (no transfer). ``plan`` is the ``[n_tokens,
    k]`` matrix of experts that ran (-1 = dropped), ``routing`` what the router chose.
    """

    layer: int
    routing: Routing
    plan: np.ndarray
    experts: list[int]
    status: list[int]
    cpu_experts: list[int]


class Reason(enum.Enum):
    """Why a transfer needs room (see :class:`EvictionRequest`)."""

    DEMAND = "demand"        # a planned expert is absent: the layer waits for it
    PREFETCH = "prefetch"    # the policy asked for a prefetch
    ADMIT = "admit"          # a unit staged in the transfer buffer moves into its pool


class Decline(enum.Enum):
    """A policy's answer when it names no victim.

    ``WAIT`` (demand loads only): evict nothing now; the load takes room in the transfer buffer
    if it has some, else waits until room frees (a stall the metrics show). ``GIVE_UP``
    (prefetches and admissions only): the prefetch is not issued, the staged unit is dropped."""

    WAIT = "wait"
    GIVE_UP = "give-up"


@dataclass(frozen=True, slots=True)
class EvictionRequest:
    """A transfer needs room in ``pool``: ``unit`` (``need_bytes`` more than are free or coming)
    for ``reason``. ``candidates`` are the pool's resident, unpinned units outside the buffer."""

    reason: Reason
    unit: UnitKey
    pool: int
    need_bytes: int
    candidates: Sequence[UnitKey]

    @property
    def decline(self) -> Decline:
        """The answer that names no victim, for this request's reason."""
        return Decline.WAIT if self.reason is Reason.DEMAND else Decline.GIVE_UP


VictimChoice = tuple[int, int, int] | Decline
"""A victim's key, or a :class:`Decline`."""
