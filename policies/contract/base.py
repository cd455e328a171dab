"""The policy contract: the hooks the engine calls, in which order, and what a policy may see and do.

This module is the one authoritative statement of the contract (docs/contract.md explains it
at more length; an exact-order test proves it). It imports nothing from the engine: the engine
imports this module, never the other way round.

Hook order
----------
For a run, the engine calls::

    policy.setup(ctx)                                  # once, before time 0 (ctx.profile: offline data)
    policy.preload(ctx)                                # units loaded with the model, placed at no cost
    policy.warm(view, units)                           # units placed by preload and cache.initial
    for each iteration (one decode step of the batch, or one request's prefill):
        policy.on_iteration_start(view)
        for layer l in 0..L-1:
            <synchronous prefetch: the GPU waits for every prefetch issued so far, if pcie.sync_prefetch>
            policy.before_layer(view, l)               # may evict, prefetch, cancel queued prefetches
            <non-MoE compute of l on the GPU stream, plus the runtime's per-layer overhead>
            plan = policy.on_routed(view, l, routing)  # routing of l is known; returns a Plan or None
            <policy.decision_us and view.spend_cpu(...) charged on the GPU stream>
            <each planned expert is a hit, late (in flight) or a miss; misses load on demand>
            policy.on_access(view, l, outcome)         # cache-state update: the accesses, in order
            policy.after_layer(view, l, outcome)       # prefetch for l+1..l+d while the experts compute
            <experts compute on the GPU (and CPU) as they become ready>
            policy.on_layer_end(view, l)               # l's experts computed; its pins are released
        policy.on_iteration_end(view)                  # an idle point: budgets and splits may change

Between hooks, whenever they happen:

* ``choose_victim(view, request)`` when a transfer needs room: ``request`` says why (demand load,
  prefetch, admission from the transfer buffer); the answer is a victim key, or
  ``request.decline`` (:data:`Decline.WAIT` for a demand load, :data:`Decline.GIVE_UP` for a
  prefetch or an admission);
* ``on_loaded(view, unit, demand)`` when a host-to-device transfer lands;
* ``admit(view, unit)`` when a unit staged in the transfer buffer has been used by its layer;
* ``on_evict(view, unit)`` for every unit that leaves VRAM, whoever asked for it;
* ``on_cancel(view, unit)`` for every prefetch withdrawn before it landed: queued (or waiting
  for room), or aborted in flight (``view.abort_prefetch``).

What a policy sees goes through ``view`` (:class:`View`), which refuses reads of the future with
:class:`CausalityError`. ``choose_victim``, ``admit``, ``on_evict`` and ``on_cancel`` get a
:class:`ReadView` (no action: the engine is making room or recording a departure); mypy holds
an override to the annotation of its hook. Only classes with ``oracle = True`` receive ``ctx.future``, the
recorded routing of later steps; they are labelled as bounds in every output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np

# the contract's data types live in hook_data; every name is re-exported here
from moesim.policies.contract.hook_data import (  # noqa: F401
    ABSENT,
    HIT,
    INFLIGHT,
    LATE,
    MISS,
    PARTIAL,
    QUEUED,
    RESIDENT,
    STATUS_NAMES,
    WAITING,
    Decline,
    EvictionRequest,
    Outcome,
    Plan,
    Reason,
    Routing,
    UnitKey,
    VictimChoice,
)
from moesim.policies.contract.needs import TOP_K, SetupNeeds  # noqa: F401  (re-exported)
from moesim.policies.contract.view import (  # noqa: F401  (re-exported)
    ActionView,
    IterationInfo,
    ReadView,
    ResidencyView,
    RoutingView,
    View,
)

# Trace columns a policy may need beside ``experts`` (see :meth:`Policy.required_columns`).
OPTIONAL_COLUMNS = ("weights", "logits", "lookahead_logits", "token_id", "embedding")


class CausalityError(RuntimeError):
    """A policy asked for information a real system would not have at that instant."""


class PolicySetupError(ValueError):
    """A policy cannot run on this trace or budget (a column it needs is missing, a parameter
    does not fit the model). The runner reports it as one line naming the policy."""


class MissingColumnsError(PolicySetupError):
    """The trace lacks a column the policy cannot work without: the policy does not apply to
    this trace (a sweep records such a point as ``n/a``, not as a failure)."""


def check_columns(policy: Policy, columns: frozenset[str] | set[str], trace_name: str) -> None:
    """Raise :class:`MissingColumnsError` when ``columns`` (the trace's) lack one of the
    policy's :meth:`~Policy.required_columns`."""
    missing = sorted(policy.required_columns() - set(columns))
    if missing:
        raise MissingColumnsError(f"policy {policy.name!r} needs trace column(s) {', '.join(missing)}, "
                                  f"which the trace ({trace_name}) lacks")


@dataclass(frozen=True)
class Profile:
    """Offline data handed to ``setup``: routing recorded for other requests (the scenario's
    ``profile:`` split, never measured). Arrays are per token (``N`` tokens, ``L`` layers):
    ``experts`` ``[N, L, k]``, ``weights`` ``[N, L, k]``, ``logits`` ``[N, L, E]``,
    ``lookahead_logits`` ``[N, L, E]`` (each ``None`` when the trace lacks it), ``request_id``
    and ``phase`` ``[N]`` (0 prefill, 1 decode), ``iteration`` ``[N]`` (tokens of one forward
    pass share it), ``embedding`` ``[I, h]`` per iteration (or ``None``). ``source`` says where
    it came from (for outputs)."""

    experts: np.ndarray
    weights: np.ndarray | None
    logits: np.ndarray | None
    lookahead_logits: np.ndarray | None
    request_id: np.ndarray
    phase: np.ndarray
    iteration: np.ndarray
    embedding: np.ndarray | None
    source: str

    @property
    def num_tokens(self) -> int:
        """Tokens in the profile."""
        return int(self.experts.shape[0])

    def frequency(self, num_experts: int) -> np.ndarray:
        """``[L, E]`` activation counts (how often each expert was routed to)."""
        L, E = self.experts.shape[1], num_experts
        out = np.zeros((L, E), dtype=np.int64)
        for layer in range(L):
            out[layer] = np.bincount(self.experts[:, layer, :].reshape(-1).astype(np.int64), minlength=E)
        return out


class FutureRouting(Protocol):
    """The oracle annotation (only for ``oracle`` policies): recorded routing of later steps."""

    def step_key(self, iteration: int, layer: int) -> float:
        """The key just after every access of step (iteration, layer)."""
        ...

    def next_use(self, layer: int, expert: int, after: float) -> float:
        """The first access key of (layer, expert) strictly after ``after`` (inf if none)."""
        ...

    def routing(self, iteration: int, layer: int) -> np.ndarray:
        """The recorded ``[n_tokens, top_k]`` routing of a (future) iteration and layer."""
        ...


class Costs(Protocol):
    """Durations in seconds from the run's cost model (for policies that plan with them)."""

    def transfer_s(self, nbytes: float) -> float:
        """Host-to-device copy of ``nbytes``."""
        ...

    def layer_s(self, n_tokens: int) -> float:
        """Non-MoE part of one layer for an iteration of ``n_tokens`` tokens."""
        ...

    def expert_s(self, n_tokens: int) -> float:
        """One routed expert applied to ``n_tokens`` tokens on the GPU."""
        ...

    def cpu_expert_s(self, n_tokens: int) -> float:
        """One routed expert applied to ``n_tokens`` tokens on the host CPU."""
        ...

    def head_s(self, n_tokens: int) -> float:
        """Once per iteration after the last layer."""
        ...

    def overhead_layer_s(self) -> float:
        """The runtime's framework overhead per MoE layer (on the GPU stream with the non-MoE
        compute of every layer; 0 without a ``runtime:``)."""
        ...

    def overhead_iteration_s(self, n_tokens: int) -> float:
        """The runtime's framework overhead per forward pass of ``n_tokens`` tokens (on the GPU
        stream with the head, after the last layer; 0 without a ``runtime:``)."""
        ...


@dataclass
class Context:
    """Static facts of a run, handed to ``setup``."""

    model: Any                     # the model's catalog spec (name, shapes, bytes)
    hardware: Any                  # the hardware's catalog spec
    cost: Costs
    num_layers: int
    num_experts: int
    top_k: int
    expert_bytes: int
    pool_capacity: list[int]       # bytes per pool (one per layer, or one global)
    buffer_bytes: int              # the transfer buffer (cache.buffer_experts)
    total_budget: int              # sum of pool capacities
    rng: np.random.Generator       # the policy's own stream, from the scenario's seed
    columns: frozenset[str]        # optional trace columns present (see OPTIONAL_COLUMNS)
    swap_out: bool = False         # cache.swap_out: an eviction copies the unit back to the host
    profile: Profile | None = None              # offline split (scenario ``profile:``)
    replayed_frequency: np.ndarray | None = None  # [L, E] counts of the replayed requests
    future: FutureRouting | None = None         # oracle policies only
    frequency_reads: int = 0
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """Say something the run's summary and metrics.json must show (a fallback taken, a
        mechanism that cannot act)."""
        if message not in self.warnings:
            self.warnings.append(message)

    def offline_frequency(self) -> np.ndarray:
        """``[L, E]`` expert popularity known before the run: from the profile split, or,
        without one, from the replayed requests themselves (an optimistic profile: the run's
        outputs then carry a warning)."""
        self.frequency_reads += 1
        if self.profile is not None:
            return self.profile.frequency(self.num_experts)
        assert self.replayed_frequency is not None
        return self.replayed_frequency

    @property
    def has_lookahead(self) -> bool:
        """The trace has ``lookahead_logits``."""
        return "lookahead_logits" in self.columns

    @property
    def has_logits(self) -> bool:
        """The trace has the full router ``logits``."""
        return "logits" in self.columns

    @property
    def has_weights(self) -> bool:
        """The trace has router ``weights``."""
        return "weights" in self.columns

    @property
    def has_embedding(self) -> bool:
        """The trace has iteration ``embedding``s."""
        return "embedding" in self.columns


class Policy:
    """Base class of every policy: override the hooks you need (all are no-ops by default).

    Parameters are the ``__init__`` keywords, stored as attributes of the same name
    (scikit-learn style: :meth:`get_params` reads them back). Class attributes:

    * ``name``: registry key; ``summary``: one line for ``simctl policies``;
    * ``paper``: the source of the mechanism (for ``simctl policies NAME``);
    * ``oracle``: reads the future (only through ``ctx.future``); reported as a bound;
    * ``lossy``: may run other experts than the routed ones (its plans are checked);
    * ``scope``: ``"layer"`` (one pool per layer, the default) or ``"global"`` (one pool);
    * ``decision_us``: CPU time of each routing decision, charged on the critical path at
      ``on_routed`` (0 by default);
    * ``host_memory``: where the system keeps experts on the host, ``"pinned"`` (the default:
      copies at ``hardware.pcie_gbps``) or ``"pageable"`` (accelerate: copies at the
      hardware's pageable rate); a class default that an instance may set from its parameters
      (``cpu-moe``: llama.cpp's ``mmap`` decides it);
    * ``setup_needs``: what the mechanism needs from the scenario and trace to run as its paper
      meant it, with the paper's defaults (:class:`SetupNeeds`, for the default parameters;
      :meth:`needs` refines it for the instance's). Every registered policy declares it, if
      only as ``SetupNeeds()``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    oracle: ClassVar[bool] = False
    lossy: ClassVar[bool] = False
    scope: str = "layer"   # a class default; a scenario's cache.scope overrides it per instance
    host_memory: str = "pinned"   # a class default; an instance may set its own (cpu-moe: from mmap)
    setup_needs: ClassVar[SetupNeeds] = SetupNeeds()
    decision_us: float = 0.0

    # -- parameters and needs -----------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """The ``__init__`` keywords and their current values."""
        sig = inspect.signature(type(self).__init__)
        return {p.name: getattr(self, p.name) for p in sig.parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def needs(self) -> SetupNeeds:
        """This instance's setup needs: the class's :attr:`setup_needs`, with ``min_tokens`` read
        from the parameter it names. A policy whose needs depend on its parameters overrides
        this (and starts from ``super().needs()``)."""
        needs = type(self).setup_needs
        if needs.min_tokens_param is not None:
            value = getattr(self, needs.min_tokens_param)
            needs = replace(needs, min_tokens=None if value is None else int(value))
        return needs

    def kind(self) -> str:
        """``oracle`` (reads the future: a bound), ``lossy`` (may run other experts than the
        routed ones) or ``lossless``: the group a comparison ranks it in."""
        return "oracle" if self.oracle else ("lossy" if self.lossy else "lossless")

    def required_columns(self) -> frozenset[str]:
        """Optional trace columns this policy cannot run without (checked at set-up: a trace
        without them is refused with one line). Default: none."""
        return frozenset()

    def read_columns(self) -> frozenset[str]:
        """Optional trace columns this policy reads when present: the replay loads only these
        (and ``experts``, plus ``weights`` for lossy policies' metrics). Default: every column,
        so a policy that does not say reads whatever the trace has."""
        return frozenset(OPTIONAL_COLUMNS)

    def report(self) -> dict[str, Any]:
        """What the policy says about its run, as plain data for the outputs (``policy_report``
        in ``metrics.json`` and a line of the summary): e.g. which predictor ran and how often it
        was right. Read once after the run. Default: nothing."""
        return {}

    def demand_only(self) -> bool:
        """Whether this policy only ever loads experts on demand: it never prefetches, spends CPU
        time, splits experts, changes budgets or reacts to landings (``on_loaded``), its plans
        at most substitute or drop experts (no CPU slots, no ``wait_for``), and it never refuses
        a demand victim while an unpinned resident is left. Such runs may take the engine's fast
        path (same metrics, no event machinery); one that breaks the promise there is stopped
        with one line. Default: False."""
        return False

    def uses_hook(self, name: str) -> bool:
        """Whether this policy does something in hook ``name`` (the engine skips the calls of
        hooks nobody uses: they run per layer). Default: the class overrides it."""
        return getattr(type(self), name) is not getattr(Policy, name)

    # -- hooks (see the module docstring for the order) ----------------------------------------
    def setup(self, ctx: Context) -> None:
        """Once before time 0."""

    def part_fractions(self, layer: int) -> tuple[float, ...]:
        """How an expert of ``layer`` splits into parts (fractions of its bytes, summing to 1).
        Asked at set-up and after each ``on_iteration_end``. Default: one part."""
        return (1.0,)

    def preload(self, ctx: Context) -> list[UnitKey]:
        """Units the system loads onto the GPU with the model, before time 0 (llama.cpp's GPU
        layers, Fiddler's popular experts, accelerate's resident layers): the engine places
        them resident at no cost, ahead of ``cache.initial``'s fill, and lists them first to
        ``warm``. They must fit their pools. Called once, after ``setup``. Default: none."""
        return []

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """The engine placed ``units`` in VRAM before time 0 (``preload``, then ``cache.initial``)."""

    def on_iteration_start(self, view: View) -> None:
        """A new iteration begins."""

    def before_layer(self, view: View, layer: int) -> None:
        """Before the non-MoE compute of ``layer``; its routing is not known yet."""

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """The routing of ``layer`` is known: say what runs (None = as routed, on the GPU)."""
        return None

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """The layer's accesses are known (demand loads issued): update cache state."""

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """While the layer's experts compute: prefetch for later layers."""

    def on_layer_end(self, view: View, layer: int) -> None:
        """The layer's experts have computed; their pins are released."""

    def on_iteration_end(self, view: View) -> None:
        """The iteration finished: an idle point."""

    def final_warnings(self) -> list[str]:
        """Asked once after the run: mechanisms of the policy that never acted in it (a
        periodic step whose period exceeds the run), shown as warnings in the run's summary
        and ``metrics.json``. Default: none."""
        return []

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """Room is needed (see :class:`EvictionRequest`): a victim among ``request.candidates``,
        or ``request.decline``. Default: the first candidate."""
        return request.candidates[0] if request.candidates else request.decline

    def admit(self, view: ReadView, unit: UnitKey) -> bool:
        """A unit staged in the transfer buffer was used: keep it (move into its pool, victims
        from ``choose_victim`` with reason ``ADMIT``) or drop it (False). Default: keep."""
        return True

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        """A host-to-device transfer of ``unit`` landed."""

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """``unit`` left VRAM."""

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """A prefetch of ``unit`` was withdrawn before it landed: before its transfer started,
        or aborted in flight by ``view.abort_prefetch`` (it held room, but was never
        resident)."""
