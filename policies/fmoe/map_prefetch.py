"""fMoE's map-guided prefetcher (fMoE paper, sections 4.2-4.5), a part that composes with any cache rule.

* Before an iteration (``on_iteration_start``), each request's embedding finds the stored map
  of most similar semantics (Eq. 4); its layers ``0..d-1`` are prefetched.
* After layer ``l`` is routed (``after_layer``), each token's probabilities of layers
  ``0..l`` (the softmax of ``view.logits``) find the stored map of most similar trajectory
  (Eq. 5); its layer ``l + d`` is prefetched ([rec] B1), or with ``trajectory_span: rest`` its
  layers ``l + d .. L - 1``, as the authors' code does (IntelliSys-Lab/FineMoE-EuroSys26,
  ``ExpertMapMatcher.traj_prefetch``: ``layer_start = num_layers_obs + prefetch_distance``,
  ``layer_end = num_layers``; the paper's text names ``P_{l+d}`` only, hence the default
  ``target``). Each later match adds to what earlier ones wanted for a layer (the code's queued
  prefetch tasks stay until their layer runs), every wanted layer is issued at ``p / (t - l_now)``
  and protected from eviction (the code's cache candidates, ``replace_cache_candidates``, which
  a prefetch never evicts: it is dropped instead).
* A prompt (an iteration of several tokens of one request) is matched token by token and
  stored as one map per token, as the authors' code does (IntelliSys-Lab/FineMoE-EuroSys26:
  ``ExpertMapMatcher.embed_prefetch`` / ``traj_prefetch`` match every row of a prefill, and
  ``ExpertTracer`` stores one map per prompt token); the paper is silent (spec B2, whose
  earlier reading, one mean map per prompt, prefetched about K of a prompt's experts per layer).
  The embedding of a prompt token is its request's (the trace records one per iteration).
* How many: experts in descending probability until their mass reaches
  ``delta = clip(1 - score, 0, 1)`` and at least K (Eqs. 6-8, ``dynamic_threshold``; without
  it exactly the top-K, the Map(T+S) ablation of Fig. 12a).
* Order: priority ``p / (t - l_now)`` (section 4.5), re-ranked as the inference advances
  (``reprioritize``, [rec] G4); queued prefetches of a layer just routed are withdrawn
  (``cancel_stale``, [rec] B7). A demand miss goes ahead of every queued prefetch (the engine's
  priority order: "pause all prefetching"); a copy in flight is not preempted.
* Tokens of a batch search separately; their sets are united at the highest priority
  ([rec] B4). After the iteration each token's map goes into the store (Step 5, redundancy
  replacement). The store is pre-filled from the profiling split (``ctx.profile``: the paper's
  70 % history), one map per token; without one it starts empty and nothing is prefetched until
  a map is stored ([rec] B9; a warning says so).
* ``match_us``: CPU time of one match, charged on the critical path (``view.spend_cpu``).
* The latest matched map of every token is the eviction ``p`` of :class:`MapPriorityCache`
  (:meth:`p_evict`), and the target layers ``l_now+1..l_now+d`` its protected window.

A trace without ``logits`` gives sparse maps from the top-k ``weights`` (the mass rule then
cannot go beyond the routed experts), and one without ``embedding`` no semantic matching; both
are warnings.
"""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import ABSENT, QUEUED, Context, Outcome, UnitKey, View
from moesim.policies.fmoe.expert_maps import ExpertMapStore, select_floats
from moesim.policies.parts.predictors import softmax_rows
from moesim.policies.parts.prefetchers import Prefetcher

SPANS = ("target", "rest")   # what one trajectory match prefetches: layer l + d, or l + d .. L - 1

class ExpertMapPrefetcher(Prefetcher):
    """Semantic and trajectory matching against an :class:`ExpertMapStore` (module docstring)."""

    def __init__(self, *, prefetch_distance: int = 3, store_capacity: int = 1000, semantic: bool = True,
                 trajectory: bool = True, dynamic_threshold: bool = True, cancel_stale: bool = True,
                 reprioritize: bool = True, match_us: float = 50.0, trajectory_span: str = "target") -> None:
        if prefetch_distance < 1:
            raise ValueError(f"prefetch_distance must be >= 1, got {prefetch_distance}")
        if store_capacity < 1:
            raise ValueError(f"store_capacity must be >= 1, got {store_capacity}")
        if match_us < 0:
            raise ValueError(f"match_us must be >= 0, got {match_us}")
        if trajectory_span not in SPANS:
            raise ValueError(f"trajectory_span must be one of {', '.join(SPANS)}, got {trajectory_span!r}")
        self.prefetch_distance = prefetch_distance
        self.store_capacity = store_capacity
        self.semantic = semantic
        self.trajectory = trajectory
        self.dynamic_threshold = dynamic_threshold
        self.cancel_stale = cancel_stale
        self.reprioritize = reprioritize
        self.match_us = match_us
        self.trajectory_span = trajectory_span

    def read_columns(self) -> frozenset[str]:
        """Reads logits, embeddings and (as a fallback) weights."""
        return frozenset({"logits", "embedding", "weights"})

    # -- set-up -----------------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        """An empty store, filled from the profile split."""
        self._L, self._J, self._K = ctx.num_layers, ctx.num_experts, ctx.top_k
        d = self.prefetch_distance
        self.store = ExpertMapStore(self.store_capacity, self._L, self._J, min(d, self._L))
        self._logits = ctx.has_logits
        self._sem_on = self.semantic and ctx.has_embedding
        if not ctx.has_logits:
            ctx.warn("fmoe: the trace has no router logits; expert maps are built from the top-k weights "
                     "(sparse), so a prefetch set never goes beyond the experts a stored map routed")
        if self.semantic and not ctx.has_embedding:
            ctx.warn("fmoe: the trace has no embeddings; semantic matching is off (no prefetch for "
                     "layers 0..d-1)")
        self.p_map = np.full((self._L, self._J), 1.0 / self._J)   # replaced, never changed in place
        self.matches = 0
        self.issued = 0
        prof = ctx.profile
        if prof is not None:
            self._prefill(prof.experts, prof.weights, prof.logits, prof.iteration, prof.embedding)
        if self.store.n == 0:
            ctx.warn("fmoe: the expert map store starts empty (no profile: split); nothing is "
                     "prefetched until the first iteration's map is stored")
        self._ctx = ctx
        self._want: dict[int, dict[int, float]] = {}
        self._reqs: list[int] = []
        self._l_now = -1
        self._window: frozenset[UnitKey] | None = None
        self._p_slots: dict[int, int] = {}
        self._units: list[int] = []
        self._req_of: list[int] = []
        self._p_of: tuple[object, ...] | None = None
        # each token's probabilities so far ``[tokens, L, J]``, their running dot products with
        # the stored maps' ``[tokens, n]`` and squared norms
        self._traj = np.zeros((0, self._L, self._J))
        self._dots = np.zeros((0, 0))
        self._tsq: list[float] = []

    def _probs(self, experts: np.ndarray, weights: np.ndarray | None, logits: np.ndarray | None
               ) -> np.ndarray:
        """``[n, J]`` router probabilities of ``n`` token rows (sparse without logits)."""
        if logits is not None and self._logits:
            return softmax_rows(logits).astype(np.float64)
        out = np.zeros((experts.shape[0], self._J))
        vals = (np.asarray(weights, dtype=np.float64) if weights is not None
                else np.ones(experts.shape, dtype=np.float64) / experts.shape[1])
        for t in range(experts.shape[0]):
            ok = experts[t] >= 0
            out[t, experts[t][ok]] = vals[t][ok]
        return out

    def _prefill(self, experts: np.ndarray, weights: np.ndarray | None, logits: np.ndarray | None,
                 iteration: np.ndarray, embedding: np.ndarray | None) -> None:
        """Insert one map per token of the profile, in order, with its iteration's embedding."""
        h = embedding.shape[1] if embedding is not None else 1
        every = None
        if logits is not None and self._logits:   # every row's softmax at once: ``_probs`` of each
            # iteration's rows gives the same numbers (a row's softmax does not depend on the rows
            # beside it, see ``softmax_rows``)
            n, L, J = logits.shape
            every = softmax_rows(logits.reshape(n * L, J)).astype(np.float64).reshape(n, L, J) + 0.0
        for it in dict.fromkeys(iteration.tolist()):
            rows = np.nonzero(iteration == it)[0]
            # ``[tokens, L, J]``; ``+ 0.0`` as the mean of one row was (a -0.0 becomes 0.0)
            maps = every[rows] if every is not None else np.stack(
                [self._probs(experts[rows, lay], None if weights is None else weights[rows, lay], None)
                 for lay in range(self._L)], axis=1) + 0.0
            sem = embedding[it] if embedding is not None else np.zeros(h)
            for emap in maps:
                self.store.insert(sem, emap)

    # -- matching ---------------------------------------------------------------------------------
    def _charge(self, view: View, n: int) -> None:
        self.matches += n
        if self.match_us and n:
            view.spend_cpu(n * self.match_us * 1e-6)

    def _add(self, target: int, emap_row: list[float], score: float) -> None:
        """Want the experts ``select_by_mass`` picks from ``emap_row`` (Python floats, as
        ``tolist`` gives them) for layer ``target`` at
        ``delta = clip(1 - score, 0, 1)`` (each at the highest probability it was wanted)."""
        d = 1.0 - score   # np.clip's result in plain Python (NaN stays NaN)
        delta = 0.0 if d < 0.0 else 1.0 if d > 1.0 else d
        self._window = None
        want = self._want.setdefault(target, {})
        for e, p in select_floats(emap_row, delta, self._K, self.dynamic_threshold):
            if p > want.get(e, -1.0):
                want[e] = p

    def _remember(self, x: int, y: int) -> None:
        """Token ``x`` (a row of the iteration) matched stored map ``y`` (``_p_slots``: each
        token's slot); :meth:`_settle_p` makes ``p_map`` of the slots once a search is done."""
        self._p_slots[x] = y

    def _settle_p(self) -> None:
        """``p_map``: the maximum of the tokens' latest maps, computed again only when a slot or
        the store changed (else it would be the same array: it is kept, and with it the cache's
        keys)."""
        slots = self._p_slots
        if not slots:
            return
        now = (self.store.version, *slots.items())
        if now != self._p_of:
            self._p_of = now
            maps = self.store.maps
            if len(slots) == 1:   # the maximum of one map is that map (a copy: slots are rewritten)
                self.p_map = maps[next(iter(slots.values()))].copy()
            else:
                self.p_map = np.max(np.stack([maps[s] for s in slots.values()]), axis=0)

    def on_iteration_start(self, view: View) -> None:
        """Semantic matching for layers ``0..d-1``."""
        ids = view.iteration.request_ids
        req_of = [int(r) for r in ids.tolist()]
        self._reqs = list(dict.fromkeys(req_of))
        # the matching units: the iteration's tokens (row indices), each with its request
        self._units = list(range(len(req_of)))
        self._req_of = req_of
        n = self.store.n
        traj, dots = self._traj, self._dots
        if traj.shape[0] == len(req_of):   # the last iteration's arrays, cleared (the store copied its maps)
            traj.fill(0.0)
        else:
            self._traj = np.zeros((len(req_of), self._L, self._J))
        if dots.shape == (len(req_of), n):
            dots.fill(0.0)
        else:
            self._dots = np.zeros((len(req_of), n))
        self._tsq = [0.0] * len(req_of)
        self._p_slots = {}
        self._want = {}
        self._l_now = -1
        self._window = None
        embs = view.embeddings() if self.semantic else None
        self._sems = ({x: np.asarray(embs[i], dtype=np.float64) for i, x in enumerate(self._reqs)}
                      if embs is not None and len(embs) == len(self._reqs) else {})
        h = None if self.store.sem is None else self.store.sem.shape[1]
        if not (self._sem_on and n and self._sems) or any(len(v) != h for v in self._sems.values()):
            return
        self._charge(view, len(self._reqs))   # one (batched) search per request
        for x in self._reqs:   # a request's tokens share its embedding, hence its match
            y, s = self.store.semantic(self._sems[x])
            for t in range(min(self.prefetch_distance, self._L)):
                self._add(t, self.store.layer_list(y, t), s)
            for u in self._units:
                if self._req_of[u] == x:
                    self._remember(u, y)
        self._settle_p()
        self.issue(view, -1)

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Record the layer's probabilities; trajectory matching for layer ``layer + d``
        (``rest``: layers ``layer + d .. L - 1``)."""
        store = self.store
        n = store.n
        traj, tsq, dots = self._traj, self._tsq, self._dots
        target = layer + self.prefetch_distance
        # the running dots and squared norms are read only by a trajectory match, made while a
        # target layer is left: not after layer L - d - 1 (they start afresh each iteration)
        match = self.trajectory and n > 0 and target < self._L
        pr = view.probs(layer) if self._logits else None
        if pr is not None and pr.shape[0] == 1 and pr.dtype.char == "f":
            # one token (a decode step) of float16/32 logits: their softmax_rows (computed in
            # float32, as the view made it) written into the token's map
            p = traj[0, layer]
            np.copyto(p, pr[0])
            if match:   # ``dot``: the products ``@`` makes (the same BLAS ddot / dgemv), with less set-up
                tsq[0] += float(p.dot(p))
                dots[0] += store.by_layer[layer, :n].dot(p)
        else:
            if pr is not None:   # a softmax has no -0.0 (exp gives +0.0): ``p + 0.0`` below is ``p``
                probs, plus = pr.astype(np.float64), False
            else:
                routing = outcome.routing
                probs, plus = self._probs(routing.experts, routing.weights, None), True
            stored = store.by_layer[layer, :n]   # what ``store.layer_dots`` multiplies (p is float64)
            for u in self._units:
                p = probs[u] + 0.0 if plus else probs[u]   # ``+ 0.0``: a sparse row's -0.0 becomes 0.0
                traj[u, layer] = p
                if match:
                    tsq[u] += float(p @ p)
                    dots[u] += stored @ p
        if self.cancel_stale:
            view.cancel_prefetches(layer)
        self._want.pop(layer, None)
        self._l_now = layer
        self._window = None
        if match:
            self._charge(view, len(self._reqs))   # one (batched) search per request
            targets = range(target, self._last(layer) + 1)
            by_layer, add, trajectory = store.by_layer, self._add, store.trajectory
            for u in self._units:
                y, s = trajectory(layer, dots[u], tsq[u])
                for t in targets:
                    add(t, by_layer[t, y].tolist(), s)
                self._remember(u, y)
            self._settle_p()
        self.issue(view, layer)

    def _last(self, l_now: int) -> int:
        """The last layer wanted once layer ``l_now`` ran: ``l_now + d``, or (``trajectory_span:
        rest``) the model's last layer."""
        return self._L - 1 if self.trajectory_span == "rest" else l_now + self.prefetch_distance

    def window(self) -> frozenset[UnitKey]:
        """Units wanted for layers ``l_now + 1 .. l_now + d`` (``trajectory_span: rest``: every
        later layer), protected from eviction; the same set until the wanted experts or ``l_now``
        change."""
        win = self._window
        if win is None:
            lo, hi = self._l_now + 1, self._last(self._l_now)
            win = self._window = frozenset((t, e, 0) for t, want in self._want.items() if lo <= t <= hi
                                           for e in want)
        return win

    def p_evict(self, layer: int, expert: int) -> float:
        """The eviction ``p`` of an expert: the latest matched maps' probability (max over
        requests; uniform before any match)."""
        return float(self.p_map[layer, expert])

    def issue(self, view: View, l_now: int) -> None:
        """Prefetch (or re-rank) every wanted expert of layers ``l_now+1..l_now+d`` (``rest``:
        every later layer) at priority ``p / (t - l_now)``, highest first."""
        # sorted by (-priority, t, e): the priority is negated back exactly (a sign flip)
        hi = self._last(l_now)
        todo = sorted([(-(p / (t - l_now)), t, e) for t, want in self._want.items()
                       if l_now < t <= hi for e, p in want.items()])
        if not todo:
            return
        cache = self.cache
        if cache is not None:
            cache.protected = self.window()
        state_of, reprioritize = view.state, self.reprioritize
        try:
            for neg, t, e in todo:
                state = state_of(t, e)
                if state == QUEUED:
                    if reprioritize:
                        view.reprioritize(t, e, 0, -neg)
                elif state == ABSENT and view.prefetch(t, e, priority=-neg):   # ABSENT: not present
                    self.issued += 1
                    if cache is not None:
                        cache.refresh((t, e, 0))
        finally:
            if cache is not None:
                cache.protected = frozenset()

    def on_iteration_end(self, view: View) -> None:
        """Store each token's map of this iteration (Step 5), with its request's embedding."""
        if not self._reqs or self._l_now != self._L - 1:
            return
        h = None if self.store.sem is None else self.store.sem.shape[1]
        for u in self._units:
            sem = self._sems.get(self._req_of[u])
            if sem is None or (h is not None and len(sem) != h):
                sem = np.zeros(1 if h is None else h)
            self.store.insert(sem, self._traj[u])
        silent = "fmoe: no map-guided prefetch was issued in this run"
        if self.issued == 0:
            self._ctx.warn(silent)
        elif silent in self._ctx.warnings:
            self._ctx.warnings.remove(silent)
