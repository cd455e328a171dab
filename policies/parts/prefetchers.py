"""Prefetchers: a predictor and an issue rule. They issue ``view.prefetch`` and tell the cache
rule what they did, so that their sets are never undermined by their own evictions."""

from __future__ import annotations

from moesim.policies.contract.base import Context, Outcome, Policy, View
from moesim.policies.parts.caches import CacheRule
from moesim.policies.parts.kernel import DeclaresKernel
from moesim.policies.parts.predictors import Predictor

_NOTHING: frozenset = frozenset()   # no protected set


class Prefetcher(Policy, DeclaresKernel):
    """Base of the prefetchers. ``cache`` is set by :meth:`Composed.assemble`; one that a kernel
    of the fast path reproduces names it as ``kernel`` (:mod:`moesim.policies.parts.kernel`)."""

    cache: CacheRule | None = None

    def read_columns(self) -> frozenset[str]:
        """A prefetcher reads what it requires unless it says more."""
        return self.required_columns()

    def prefetch_set(self, view: View, layer: int, experts: list[tuple[int, float]]) -> int:
        """Prefetch ``(expert, score)`` pairs for ``layer`` in the given order (higher score first
        in the lane). Members already present count as used now; no prefetch of the set may evict
        another member of it (one that would have to is not issued). Returns how many were issued."""
        cache = self.cache
        prefetch = view.prefetch
        issued = 0
        if cache is None:
            # a prefetch of a present unit is refused, changing nothing (View.prefetch): no
            # presence check is needed before it
            for e, score in experts:
                if prefetch(layer, e, 0, score):
                    issued += 1
            return issued
        is_present, refresh = view.is_present, cache.refresh
        keys = []   # plain loops: a comprehension is a call of its own, and sets are small
        absent = []
        for e, score in experts:
            key = (layer, e, 0)
            keys.append(key)
            if is_present(layer, e, 0):
                refresh(key)
            else:
                absent.append((key, e, score))
        if not absent:   # every member present: no prefetch, so no eviction for the set to escape
            return 0
        cache.protected = frozenset(keys)
        try:
            # a member absent above is absent still unless an earlier issue of this loop brought
            # it (a repeated member), and then its prefetch is refused as the check would skip it
            for key, e, score in absent:
                if prefetch(layer, e, 0, score):
                    refresh(key)
                    issued += 1
        finally:
            cache.protected = _NOTHING
        return issued


class NextLayerPrefetcher(Prefetcher):
    """After layer ``l`` is routed, prefetch the predictor's guess for layer ``l + 1``
    (``experts`` per token, default ``top_k``); after the last layer, for layer 0 of the next
    iteration when ``cross_token``."""

    kernel = "next-layer"

    def __init__(self, predictor: Predictor, experts: int | None = None, cross_token: bool = False) -> None:
        if experts is not None and experts < 0:
            raise ValueError("prefetch_experts must be >= 0")
        self.predictor = predictor
        self.experts = experts
        self.cross_token = cross_token
        self._k = 0

    def required_columns(self) -> frozenset[str]:
        """The predictor's."""
        return self.predictor.required_columns()

    def read_columns(self) -> frozenset[str]:
        """The predictor's."""
        return self.predictor.read_columns()

    def setup(self, ctx: Context) -> None:
        """Resolve ``experts`` and set up the predictor."""
        self._k = ctx.top_k if self.experts is None else self.experts
        self.predictor.setup(ctx)

    @property
    def experts_per_token(self) -> int:
        """Experts guessed per token: ``experts``, or ``top_k`` when None (resolved at ``setup``;
        0 before)."""
        return self._k

    def target(self, view: View, layer: int) -> int | None:
        """The layer prefetched after ``layer`` (None: nothing)."""
        if layer + 1 < view.num_layers:
            return layer + 1
        return 0 if self.cross_token else None

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Prefetch the guess for the next layer."""
        if self._k and self.target(view, layer) is not None:
            self.prefetch_guess(view, layer, self.predictor.predict(view, layer, self._k))

    def prefetch_guess(self, view: View, layer: int, guess: list[tuple[int, float]]) -> None:
        """Prefetch ``guess``, a prediction made after ``layer``, for the layer this prefetcher
        targets then (nothing when there is none): :meth:`after_layer` with a guess the caller
        already has."""
        target = self.target(view, layer)
        if target is not None:
            self.prefetch_set(view, target, guess)

