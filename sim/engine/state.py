"""The state of one run, with a name: what is replayed, the VRAM, the counters and records,
where the replay stands, its flags and its clock. The event loop (:mod:`~moesim.sim.engine.gpu`),
the causal view (:mod:`~moesim.sim.engine.view`), the transfers, the fast kernels
(:mod:`moesim.sim.fast`), the metrics (:mod:`moesim.sim.run.metrics`) and the real executor
(:mod:`moesim.sim.real.executor`) all work on one :class:`RunState`; none reads another's fields.

The owner of a run builds it with :meth:`RunState.build`, then wires in the two objects that
need the state themselves: the policy's :attr:`~RunState.view` and the :attr:`~RunState.transfers`
that carry out the policy's actions (the event loop's
:class:`~moesim.sim.engine.transfers.Transfers`, or the executor's real copies).

Hot loops bind the fields they read to locals once, as they did on the engine; a slotted
dataclass's attributes cost no more than an object's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from moesim.policies.contract.base import (
    OPTIONAL_COLUMNS,
    Context,
    Policy,
    Profile,
    Routing,
    UnitKey,
    View,
)
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.frozen import slot_maker
from moesim.sim.engine.records import RunStats, StepRecords, TimelineEvent
from moesim.sim.engine.scheduler import Scheduler
from moesim.sim.engine.vram import Vram
from moesim.sim.engine.workload import Iteration, Workload
from moesim.traces.format.trace_file import Trace

_new_routing = slot_maker(Routing)   # Routing(layer, experts, weights), per routed layer


class Actions(Protocol):
    """What carries out a policy's actions (:class:`moesim.policies.contract.base.View`'s
    prefetch, reprioritize, evict, cancel and budget calls), keeping every VRAM and lane rule."""

    def issue_prefetch(self, key: UnitKey, priority: float, into_buffer: bool) -> bool:
        """Issue a prefetch of ``key``; False, doing nothing, when it is present or gets no room."""
        ...

    def reprioritize(self, key: UnitKey, priority: float) -> bool:
        """Give a queued prefetch a new priority; False if it is not queued."""
        ...

    def evict_key(self, key: UnitKey) -> bool:
        """Evict a resident, unpinned unit; False if ``key`` is not one."""
        ...

    def cancel_queued(self, layer: int | None) -> int:
        """Withdraw queued prefetches of ``layer`` (all if None); how many."""
        ...

    def set_layer_budgets(self, budgets: list[int]) -> None:
        """Re-split the expert budget among layers (bytes per layer)."""
        ...


A = TypeVar("A", bound=Actions)


@dataclass(slots=True, eq=False)
class RunState(Generic[A]):
    """Everything one run shares among its parts (see the module docstring). ``A`` is the type
    of :attr:`transfers`: the event loop's :class:`~moesim.sim.engine.transfers.Transfers` or
    the executor's residency."""

    # -- what is replayed
    workload: Workload
    trace: Trace
    policy: Policy
    cost: CostModel
    ctx: Context                   # the static facts handed to the policy's setup
    L: int                         # MoE layers
    E: int                         # experts per layer
    K: int                         # top-k
    expert_bytes: int
    # -- memory
    vram: Vram
    global_pool: bool              # one pool for every layer (policy scope "global")
    fractions: list[tuple[float, ...]]   # per layer: how its experts split into parts
    initial: str                   # cache.initial: empty, popular or random
    rng: np.random.Generator       # the run's own random stream (cache.initial: random)
    # -- counters and records
    stats: RunStats
    clock: Callable[[], float]     # the owner's clock: SimPy's, or the wall clock of a real run
    cur_iter: Iteration            # the iteration being replayed (see position below)
    steps: StepRecords = field(default_factory=StepRecords)
    timeline: list[TimelineEvent] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # -- flags
    record_steps: bool = True
    record_timeline: bool = False
    check_invariants: bool = False
    sync_prefetch: bool = False
    progress: Callable[[int, int], None] | None = None
    options: dict[str, Any] = field(default_factory=dict)   # the owner's options, by name (the fast replays declare each)
    # -- position: the iteration and layer being replayed
    cur_layer: int = -1            # -1 before layer 0 of an iteration, L after the last
    routed_upto: int = -1          # the last layer of the current iteration whose routing is known
    prev_iter: Iteration | None = None
    emb_index: dict[int, int] | None = None   # trace embedding row -> index into trace.embedding
    # -- host time not yet charged on the GPU stream
    spent_s: float = 0.0           # policy CPU time and prefetch issue cost
    issue_spent_s: float = 0.0     # the part of spent_s that is runtime.prefetch_issue_us
    cpu_free_at: float = 0.0       # when the CPU finishes the experts queued on it
    # -- which replay ran
    fast_now: float | None = None  # the clock of a fast replay (the owner's clock otherwise)
    path: str = "event"            # "event" (SimPy) or "fast (...)" (sim/fast)
    path_reason: str = ""          # why no fast replay ran
    part_sizes: dict[tuple[float, ...], tuple[int, ...]] = field(default_factory=dict)  # split -> bytes of each part
    scheduler: Scheduler | None = None   # serving: forms the iterations as the GPU frees (set by Stepper)
    # -- wired in by the owner right after build (they need the state themselves)
    view: View = field(init=False)
    transfers: A = field(init=False)

    @classmethod
    def build(cls, workload: Workload, policy: Policy, cost: CostModel, *, budget_bytes: int,
              buffer_bytes: int, initial: str, seed: int, profile: Profile | None,
              stats: RunStats, clock: Callable[[], float], model: Any = None,
              swap_out: bool = False, **flags: Any) -> RunState[A]:
        """A fresh run's state: pools of ``budget_bytes`` (one per layer, or one for a policy of
        global scope), the transfer buffer, whole experts, the policy's context (its random
        stream and the engine's spawned from ``seed``), positioned before the first iteration.
        ``model`` is the catalog spec the policy sees (default: the cost model's); ``flags``
        are the recording flags and ``progress``."""
        tr = workload.trace
        m = tr.model
        spec = cost.model if model is None else model
        L = m.num_layers
        global_pool = policy.scope == "global"
        caps = [int(budget_bytes)] if global_pool else [int(budget_bytes) // L] * L
        vram = Vram(caps, buffer_bytes)
        pol_seed, eng_seed = np.random.SeedSequence(seed).spawn(2)
        columns = frozenset(c for c in OPTIONAL_COLUMNS if getattr(tr, c, None) is not None)
        ctx = Context(
            model=spec, hardware=cost.hardware, cost=cost, num_layers=L,
            num_experts=m.num_experts, top_k=m.top_k, expert_bytes=spec.expert_bytes,
            pool_capacity=list(caps), buffer_bytes=vram.buffer_capacity,
            total_budget=sum(caps), rng=np.random.default_rng(pol_seed), columns=columns,
            profile=profile, future=workload.future() if policy.oracle else None,
            swap_out=swap_out,
        )
        emb_index = ({int(r): i for i, r in enumerate(tr.embedding_rows)}
                     if tr.embedding_rows is not None else None)
        return cls(workload=workload, trace=tr, policy=policy, cost=cost, ctx=ctx, L=L,
                   E=m.num_experts, K=m.top_k, expert_bytes=spec.expert_bytes, vram=vram,
                   global_pool=global_pool, fractions=[(1.0,)] * L, initial=initial,
                   rng=np.random.default_rng(eng_seed), stats=stats, clock=clock,
                   cur_iter=workload.iterations[0], emb_index=emb_index, **flags)

    # ------------------------------------------------------------------------------------------
    def now(self) -> float:
        """The run's time in seconds (a fast replay's clock, or the owner's)."""
        return self.fast_now if self.fast_now is not None else self.clock()

    def pool_of(self, layer: int) -> int:
        """The pool of ``layer``'s units."""
        return 0 if self.global_pool else layer

    def sizes_of(self, layer: int) -> tuple[int, ...]:
        """Bytes of each part of an expert of ``layer`` (made once per distinct split: the
        fractions change only between iterations)."""
        fr = self.fractions[layer]
        sizes = self.part_sizes.get(fr)
        if sizes is None:
            sizes = self.part_sizes[fr] = tuple(int(round(f * self.expert_bytes)) for f in fr)
        return sizes

    def part_bytes(self, layer: int, part: int) -> int:
        """Bytes of part ``part`` of an expert of ``layer``."""
        sizes = self.sizes_of(layer)
        if not 0 <= part < len(sizes):
            raise ValueError(f"layer {layer} has {len(sizes)} part(s); no part {part}")
        return sizes[part]

    @staticmethod
    def rows_of(it: Iteration, layer: int) -> slice | np.ndarray:
        """Trace rows of ``layer`` for the tokens of ``it`` (a slice for one token: numpy views
        are much cheaper than fancy indexing on the hot path)."""
        if it.rows0.shape[0] == 1:
            r = int(it.rows0[0]) + layer
            return slice(r, r + 1)
        return it.rows0 + layer

    def routing_of(self, it: Iteration, layer: int) -> Routing:
        """The recorded routing of ``layer`` for ``it``."""
        rows0 = it.rows0
        if rows0.shape[0] == 1:   # rows_of, inlined: one token's rows are a slice
            r = int(rows0[0]) + layer
            rows: slice | np.ndarray = slice(r, r + 1)
        else:
            rows = rows0 + layer
        w = self.trace.weights
        routing: Routing = _new_routing(layer, self.trace.experts[rows], None if w is None else w[rows])
        return routing
