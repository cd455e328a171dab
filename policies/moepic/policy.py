"""MoEpic: expert split, LCP cache, speculative prefetch and the cache configurator
(Yan, Liu, Xu, Huang: "Accelerating Mixture-of-Expert Inference with Adaptive Expert Split
Mechanism"; equation and line numbers below are the paper's).

Mechanism (section 3), per layer ``i``:

* Every expert is split vertically into a *top* segment, a fraction ``theta_i`` of its bytes
  (part 0), and a *bottom* segment (part 1). The layer's VRAM budget ``V_i`` holds the top
  segments of ``C_i = V_i / theta_i`` experts, chosen and replaced by LCP (Eq. 4,
  :mod:`policies.lcp`). ``theta = 1`` is a whole-expert cache, ``theta = 0`` no cache.
* While layer ``i - 1`` computes, the router of layer ``i`` applied to layer ``i - 1``'s hidden
  state (Eq. 3, the trace's ``lookahead_logits``; for layer 0 the previous token's last layer)
  predicts the ``K`` activated experts of layer ``i`` (its top-``K`` scores: section 3.2
  prefetches "the activated experts" predicted, into a buffer of ``K`` experts); they are
  prefetched one by one in descending predicted score into the transfer buffer
  (``cache.buffer_experts``): only the bottom when the top is cached, else the whole expert.
  Nothing past the ``K``-th prediction is fetched, however much buffer room is left (for an
  iteration of many tokens the ``K`` experts of best score over its tokens). When layer ``i``
  is routed MoEpic terminates the prefetch: every copy of a wrong guess stops, queued or in
  flight (``view.abort_prefetch``); a right guess still queued loads on demand instead, one in
  flight goes on; missing segments load on demand while resident segments compute (the
  engine's partial compute). The cached tops stay where they are in a prefill too, when the
  layer routes to more experts than the pool and buffer hold: each computes first and its
  bottom streams through the buffer (section 4.2: MoEpic "overlaps the computation of cached
  experts with the loading of missing experts" in the prefill stage).
* A segment staged in the buffer is dropped after use, except the top segment of an activated
  expert, which replaces the least-priority cached top (LCP replacement on a miss).
* Every ``tau`` tokens, at the next idle point, :class:`CacheConfigurator` (Algorithm 1) sets
  new ``V_i`` and ``theta_i`` from the recorded statistics (:class:`SplitStats`) and the cost
  model; the cache is then rebuilt: each layer keeps the top segments of its ``C_i``
  highest-priority experts, evicting the rest (everything, if its split changed), and the
  missing ones re-load as background prefetches.

Ablations (section 4.4) are parameters: ``speculative=False`` prefetches in random order
(w/o SP), ``cache_policy="random"`` replaces at random (w/o LCP), ``configurator=False``
keeps uniform budgets and ``theta`` (w/o CCA). The degenerate cases of section 2.3 are
registered as ``moepic-cache-only`` (``theta`` 1, no prefetch) and ``moepic-prefetch-only``
(``theta`` 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.policies.contract.base import (
    ABSENT,
    INFLIGHT,
    RESIDENT,
    Context,
    EvictionRequest,
    Outcome,
    Plan,
    Policy,
    PolicySetupError,
    ReadView,
    Reason,
    Routing,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.contract.needs import TOP_K, SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.moepic.configurator import (
    Allocation,
    CacheConfigurator,
    SplitStats,
    Timing,
    pool_splits,
    split_fractions,
)
from moesim.policies.moepic.speculative import SpeculativePrefetch
from moesim.policies.parts.lcp_priority import CachePriority

CACHE_POLICIES = ("lcp", "random")


# ------------------------------------------------------------------------------------------------
# The policy


@register
class MoEpic(SpeculativePrefetch, Policy):
    """MoEpic (see the module docstring): top segments (share ``theta``, initially 0.5) cached
    under LCP (``rho`` 0.25, ``omega`` 128 tokens), bottoms prefetched for the next layer in
    descending predicted score into the transfer buffer, and the cache configurator
    (Algorithm 1, allocation granularity ``zeta`` 0.01) every ``tau`` (5000) tokens.

    ``speculative`` False: prefetch in random order (the paper's "w/o SP"). ``prefetch``
    False: no prefetch (cache only). ``cache_policy`` "random": random replacement and a
    random cache at reconfiguration ("w/o LCP"). ``configurator`` False: uniform budgets and a
    fixed ``theta`` ("w/o CCA").
    """

    name = "moepic"
    summary = "expert split: LCP-cached top segments, speculative bottom prefetch, cache configurator"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}), buffer_experts=TOP_K, min_tokens_param="tau",
                             source="MoEpic section 4.1: Eq. 3's lookahead gate, a buffer of K experts, "
                                    "tau = 5000 tokens")

    def __init__(self, *, theta: float = 0.5, rho: float = 0.25, omega: float = 128.0,
                 tau: int = 5000, zeta: float = 0.01, speculative: bool = True,
                 prefetch: bool = True, cache_policy: str = "lcp",
                 configurator: bool = True) -> None:
        if not 0.0 <= theta <= 1.0:
            raise ValueError(f"theta must be in [0, 1], got {theta}")
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if omega <= 0:
            raise ValueError(f"omega must be > 0, got {omega}")
        if tau < 1:
            raise ValueError(f"tau must be >= 1, got {tau}")
        if not 0.0 < zeta < 1.0:
            raise ValueError(f"zeta must be in (0, 1), got {zeta}")
        if cache_policy not in CACHE_POLICIES:
            raise ValueError(f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, got {cache_policy!r}")
        self.theta = theta
        self.rho = rho
        self.omega = omega
        self.tau = tau
        self.zeta = zeta
        self.speculative = speculative
        self.prefetch = prefetch
        self.cache_policy = cache_policy
        self.configurator = configurator
        self.applied: list[Allocation] = []     # every configuration installed, in order
        self.timing: Timing | None = None        # Algorithm 1's latency inputs, set by setup()
        self._fractions: list[tuple[float, ...]] = []

    def read_columns(self) -> frozenset[str]:
        """The lookahead router logits rank the experts to prefetch (Eq. 3) and feed the
        configurator's hit statistics; ranked at random (``speculative`` False) or used by
        neither mechanism, nothing is read."""
        uses = self.speculative and (self.prefetch or self.configurator)
        return frozenset({"lookahead_logits"}) if uses else frozenset()

    def needs(self) -> SetupNeeds:
        """The lookahead for the speculative ranking, the buffer for any prefetch, the run length
        for the configurator: each only where its mechanism is on."""
        needs = super().needs()
        return needs.without(columns=set() if self.prefetch and self.speculative else {"lookahead_logits"},
                             buffer=not self.prefetch, min_tokens=not self.configurator)

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        L, E, K = ctx.num_layers, ctx.num_experts, ctx.top_k
        if len(ctx.pool_capacity) != L:
            raise PolicySetupError(f"{self.name} sets a budget per layer: it needs one pool per layer "
                                   "(cache.scope: layer)")
        self._L, self._E, self._K = L, E, K
        self._eb = ctx.expert_bytes
        self._budget = [c / self._eb for c in ctx.pool_capacity]   # V_i in experts (uniform)
        # theta_i = V_i / C_i with C_i <= N (Eq. 11): a split theta whose V_i / theta exceeds the
        # N experts of a layer rises to V_i / N, so that the N top segments fill the budget
        self._theta = [max(float(self.theta), v / E) if 0.0 < self.theta < 1.0 else float(self.theta)
                       for v in self._budget]
        self._fractions = [split_fractions(t) for t in self._theta]
        self._keeps = [self._keep(i) for i in range(L)]
        self._sizes: list[tuple[int, ...] | None] = [None] * L   # part bytes, read once per split
        self._total = ctx.total_budget / self._eb                   # V_e
        self._total_bytes = ctx.total_budget
        self._min_budget = 0.0 if ctx.buffer_bytes >= self._eb else 2.0
        # no transfer buffer: nothing is ever staged there (no unit is in it, none drains)
        self._no_buffer = ctx.buffer_bytes <= 0
        smallest = min(min(f) for f in self._fractions) * self._eb
        if self.prefetch and ctx.buffer_bytes < smallest:
            ctx.warn(f"{self.name}: the transfer buffer (cache.buffer_experts) holds no expert segment, so the "
                     "speculative prefetch never issues; give cache.buffer_experts (the paper's K = top_k)")
        self._has_lookahead = ctx.has_lookahead
        self._prio = CachePriority(L, E, rho=self.rho, omega=self.omega)
        self._stats = SplitStats(L, E) if self.configurator else None
        cost = ctx.cost
        # the engine's clock: a layer's non-MoE part carries the runtime's per-layer overhead,
        # the head the runtime's per-forward-pass overhead (both 0 without a runtime:)
        self.timing = Timing(t_att=cost.layer_s(1) + cost.overhead_layer_s(), t_moe=K * cost.expert_s(1),
                             t_head=cost.head_s(1) + cost.overhead_iteration_s(1),
                             t_load=cost.transfer_s(self._eb), top_k=K)
        self._rng = ctx.rng
        self._tokens = 0
        self._next_config = self.tau
        self._config_due = False
        self._spec: dict[UnitKey, int] = {}          # speculative prefetch -> iteration it is for
        self._reload: set[UnitKey] = set()           # top segments re-loading after a reconfiguration
        self._reload_todo: list[UnitKey] = []
        # layer -> [iteration, experts in predicted order, their scores, next position]
        self._queue: dict[int, list] = {}
        self._pred: dict[int, tuple[int, list[list[int]]]] = {}   # layer -> (iteration, [n][E] predicted order)
        self._routed = (-1, -1)                      # (iteration, layer) routed last
        self._needed: set[int] = set()
        self._admitting: UnitKey | None = None       # the unit admit() let in, while it moves
        self._ran: list[list[int]] = [[] for _ in range(L)]   # experts each layer ran last
        self.applied = []

    def part_fractions(self, layer: int) -> tuple[float, ...]:
        """(theta_i, 1 - theta_i): part 0 is the top segment, part 1 the bottom."""
        return self._fractions[layer] if self._fractions else (1.0,)

    # -- helpers --------------------------------------------------------------------------------
    def _keep(self, layer: int) -> tuple[bool, ...]:
        """Per part of an expert of ``layer``, whether it stays in the cache: top segments (or
        whole experts when ``theta_i`` is 1) do; bottom segments (or whole experts when
        ``theta_i`` is 0) only pass through. Kept in ``_keeps`` for the current split."""
        if len(self._fractions[layer]) == 2:
            return (True, False)
        return (self._theta[layer] >= 1.0,)

    def _cacheable(self, key: UnitKey) -> bool:
        """The unit stays in the cache (see :meth:`_keep`)."""
        return self._keeps[key[0]][key[2]]

    def _victim(self, candidates: Sequence[UnitKey]) -> UnitKey:
        """Bottoms left in the pool go first; then LCP's least priority, or a random top."""
        keeps = self._keeps
        transient = [k for k in candidates if not keeps[k[0]][k[2]]]
        if transient:
            return self._prio.victim(transient)
        if self.cache_policy == "random":
            return candidates[int(self._rng.integers(len(candidates)))]
        return self._prio.victim(candidates)

    def _cache_order(self, layer: int) -> np.ndarray | list[int]:
        if self.cache_policy == "random":
            return self._rng.permutation(self._E)
        return self._prio.ranking_list(layer)

    def _sweep(self, view: View, layer: int) -> None:
        """Bottom segments that a demand load put in free pool room leave once their layer ran
        (only the experts the layer just ran can have one there)."""
        nparts = len(self._fractions[layer])
        part = 1 if nparts == 2 else 0
        if nparts == 1 and self._theta[layer] >= 1.0:
            return
        state = view.state
        if self._no_buffer:
            for e in self._ran[layer]:
                if state(layer, e, part) == RESIDENT:
                    view.evict(layer, e, part)
            return
        for e in self._ran[layer]:
            if state(layer, e, part) == RESIDENT and not view.in_buffer(layer, e, part):
                view.evict(layer, e, part)

    # -- hooks ----------------------------------------------------------------------------------
    def warm(self, view: View, units: list[UnitKey]) -> None:
        for key in units:
            if not self._cacheable(key):
                view.evict(*key)

    def on_iteration_start(self, view: View) -> None:
        it = view.iteration_index
        if self._reload_todo:
            for key in self._reload_todo:
                layer = key[0]
                if (view.state(*key) == ABSENT
                        and view.free(view.pool_of(layer)) >= view.part_bytes(layer, key[2])
                        and view.prefetch(*key, priority=-(1.0 + layer))):
                    self._reload.add(key)
            self._reload_todo = []
        entry = self._queue.get(0)
        if entry is None or entry[0] != it:
            self._predict(view, 0, it, view.previous_lookahead_logits())
        if self.prefetch:
            self._fill(view, 0)

    def before_layer(self, view: View, layer: int) -> None:
        if layer > 0:
            self._sweep(view, layer - 1)
        if self.prefetch:
            self._fill(view, layer)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        it = view.iteration_index
        ex = routing.experts
        needed = {e for e in (ex[0].tolist() if ex.shape[0] == 1 else ex.ravel().tolist()) if e >= 0}
        self._routed = (it, layer)
        self._needed = needed
        self._admitting = None
        # the routing is known: MoEpic terminates the prefetch for this layer (section 3.2)
        self._queue.pop(layer, None)
        spec = self._spec
        if not spec and not self._reload:
            # no guess and no re-load is issued: the layer's pool holds only resident units (its
            # demand loads of earlier iterations have landed), so there is nothing to stop
            return None
        self._terminate(view, layer, needed)
        # wrong guesses already in the buffer make room for the demand loads
        for key in [k for k, t in spec.items() if k[0] == layer and t <= it]:
            if key[1] not in needed and view.state(*key) == RESIDENT and view.in_buffer(*key):
                view.evict(*key)
        return None

    def _terminate(self, view: View, layer: int, needed: set[int]) -> None:
        """Stop the prefetch of ``layer`` now that it is routed: the copies of wrong guesses,
        queued or in flight, are aborted (their lane and room free at once); a right guess still
        queued is withdrawn so that it loads on demand, ahead of every prefetch; one in flight
        goes on (stopping it would only move its bytes again). A top segment re-loading after a
        reconfiguration is not a guess: if its expert is needed it is treated as a right guess,
        else it goes on."""
        state_of, abort, reload = view.state, view.abort_prefetch, self._reload
        # the units not landed when the layer was routed: none lands while they are stopped
        # (an abort frees a lane, which may start a queued one: each state is read when reached)
        for key in view.units_of_layer(layer, in_transit=True):
            state = state_of(*key)
            if key[1] in needed:
                if state != INFLIGHT:
                    abort(*key)
            elif key not in reload:
                abort(*key)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        it = view.iteration_index
        rows = outcome.plan.tolist()
        n = len(rows)
        if self._stats is not None:
            entry = self._pred.get(layer)
            pred = None
            if entry is not None and entry[0] == it:
                order = entry[1]
                if len(order) == n:
                    pred = order
                elif len(order) == 1 or n == 1:
                    pred = [order[-1]] * n
            self._stats.record(layer, rows, self._cache_order(layer), pred)
        self._prio.observe(layer, rows)
        self._ran[layer] = outcome.experts
        last = layer == self._L - 1
        if last:
            self._tokens += n
            if self.configurator and self._tokens >= self._next_config:
                self._config_due = True
        if not (self.prefetch or self._stats is not None):
            return
        if last and self._config_due:
            return
        logits = view.lookahead_logits(layer)
        # a one-token guess's scores (used by the prefetch only) read from the softmax the view
        # makes a block of trace rows at a time: the same numbers as computed from the row
        probs = (view.lookahead_probs(layer)
                 if (self.prefetch and not self._no_buffer and self.speculative and logits is not None
                     and logits.shape[0] == 1)
                 else None)
        # layer 0 of the next token from the last layer (as AdapMoE does)
        target, target_iter = (0, it + 1) if last else (layer + 1, it)
        self._predict(view, target, target_iter, logits, probs)
        if self.prefetch:
            self._fill(view, target)

    def on_loaded(self, view: View, unit: UnitKey, demand: bool) -> None:
        target_iter = self._spec.get(unit)
        if demand or target_iter is None:
            return
        it = view.iteration_index
        r_it, r_layer = self._routed
        passed = target_iter < it or (target_iter == it and r_it == it and unit[0] <= r_layer)
        if passed and not view.pinned(unit[0], unit[1]):
            view.evict(*unit)   # a guess that landed after its layer was routed, and was wrong

    def admit(self, view: ReadView, unit: UnitKey) -> bool:
        """A segment staged in the buffer has been used: the top of an activated expert
        replaces the least-priority cached top (LCP replacement, section 3.3; the victims come
        from ``choose_victim`` while the unit still sits in the buffer); bottoms and unused
        guesses are dropped."""
        layer, e, p = unit
        if not self._keeps[layer][p]:
            return False
        if self._routed != (view.iteration_index, layer) or e not in self._needed:
            return False
        self._admitting = unit
        self._spec.pop(unit, None)   # a right guess, used: now a cached top, no longer a guess
        return True

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """Room for an admitted top segment: evict by the replacement rule. Room for a demand
        load: stage it in the transfer buffer when that has room (the cache is updated when it
        is admitted); wait for the buffer while it holds a segment the layer has yet to compute
        (it frees once that computes: a prefill streams its missing segments through the buffer
        and keeps the cached tops); else evict by the replacement rule."""
        candidates = request.candidates
        if not candidates:
            return request.decline
        if self._no_buffer:   # no room to stage in, nothing staged that could drain
            return self._victim(candidates)
        adm = self._admitting
        if adm is not None and view.in_buffer(*adm):
            return self._victim(candidates)
        layer = candidates[0][0]
        if view.buffer_free() >= max(self._sizes[layer] or self._part_sizes(view, layer)):
            return request.decline
        if request.reason is Reason.DEMAND and self._buffer_drains(view, request.unit[0]):
            return request.decline
        return self._victim(candidates)

    def _buffer_drains(self, view: ReadView, layer: int) -> bool:
        """The transfer buffer holds (or is copying) a segment of ``layer`` that the layer has yet
        to compute: its room frees when it computes, without an eviction."""
        for key in view.units_of_layer(layer):
            if view.in_buffer(*key) and view.pinned(key[0], key[1]):
                return True
        return False

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        self._spec.pop(unit, None)
        self._reload.discard(unit)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        self._spec.pop(unit, None)
        self._reload.discard(unit)

    def final_warnings(self) -> list[str]:
        if self.configurator and self._next_config == self.tau and self._tokens < self.tau:
            return [f"{self.name}: tau = {self.tau} tokens, but the run routed only {self._tokens}: the cache "
                    "configurator (Algorithm 1) never ran; lower policy.params.tau or replay more tokens"]
        return []

    def on_iteration_end(self, view: View) -> None:
        self._sweep(view, self._L - 1)
        if self._config_due:
            self._reconfigure(view)

    # -- cache configuration (Algorithm 1, lines 8-10) --------------------------------------------
    def configuration(self) -> Allocation:
        """Run the configurator on the statistics so far from the current budgets (no change)."""
        assert self._stats is not None and self.timing is not None
        stats = [self._stats.layer(i) for i in range(self._L)]
        conf = CacheConfigurator(timing=self.timing, total=self._total, zeta=self.zeta,
                                 min_budget=self._min_budget)
        return conf.allocate(stats, self._budget)

    def _reconfigure(self, view: View) -> None:
        view.cancel_prefetches()   # on_cancel forgets them
        self._queue.clear()
        for key in list(self._spec):
            if view.state(*key) == RESIDENT:
                view.evict(*key)
        L = self._L
        if any(view.state(*k) != RESIDENT for layer in range(L) for k in view.units_of_layer(layer)):
            return   # a transfer is still in flight: the device is not idle, try again later
        alloc = self.configuration()
        caps, new_fr, new_theta = pool_splits(alloc, self._eb, self._total_bytes)
        for i in range(L):
            c = int(alloc.cache_size[i])
            if self.cache_policy == "random":   # w/o LCP: keep cached tops at random, fill at random
                cached = sorted(k[1] for k in view.resident_units(view.pool_of(i)) if k[2] == 0)
                rest = [int(e) for e in self._rng.permutation(self._E) if int(e) not in cached]
                keep = set(([int(e) for e in self._rng.permutation(cached)] + rest)[:c])
            else:
                keep = set(self._prio.ranking_list(i)[:c])
            changed = new_fr[i] != self._fractions[i]
            for key in view.units_of_layer(i):
                if changed or key[1] not in keep or not self._cacheable(key):
                    view.evict(*key)
            self._fractions[i] = new_fr[i]
            self._sizes[i] = None
            self._theta[i] = new_theta[i]
            self._keeps[i] = self._keep(i)
            self._budget[i] = float(alloc.budgets[i])
            self._reload_todo.extend((i, e, 0) for e in sorted(keep) if view.state(i, e, 0) == ABSENT)
        view.set_layer_budgets(caps)
        self._config_due = False
        while self._next_config <= self._tokens:
            self._next_config += self.tau
        self.applied.append(alloc)
