"""A policy of your own in one file: a least-frequently-used cache rule, joined with the shipped
next-layer lookahead prefetcher. A scenario lists this file under ``plugins:`` and names the
policy (``scenarios/plugin-example.yaml``); nothing in moesim changes.

A cache rule's extension points: ``victim`` picks among the candidates that need not stay
(those a prefetcher protects are already left out), ``refresh`` counts a unit as used now (the
prefetcher calls it for a unit it found present or issued), and the hooks ``on_access``,
``on_evict`` and ``on_cancel`` keep the rule's state. ``moesim.testing.check_policy`` checks the
policy (``tests/test_plugin_example.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Outcome,
    ReadView,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.caches import CacheRule
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import make_predictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher


class FewestUses(CacheRule):
    """Evicts the unit used fewest times since it came in (ties: the one used longest ago)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0                          # accesses so far: a logical time
        self.uses: dict[UnitKey, int] = {}      # accesses since the unit came in
        self.last: dict[UnitKey, int] = {}      # logical time of its latest access

    def setup(self, ctx: Context) -> None:
        """A run starts with nothing remembered."""
        self.clock = 0
        self.uses.clear()
        self.last.clear()

    def refresh(self, key: UnitKey) -> None:
        """``key`` is used now: by an access, or by the prefetcher (present or issued)."""
        self.clock += 1
        self.uses[key] = self.uses.get(key, 0) + 1
        self.last[key] = self.clock

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """Units placed before time 0 count as used, in order."""
        for key in units:
            self.refresh(key)

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """The layer's experts, in access order."""
        for expert in outcome.experts:
            self.refresh((layer, expert, 0))

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """A unit that leaves is forgotten: it counts from zero when it comes back."""
        self.uses.pop(unit, None)
        self.last.pop(unit, None)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """A prefetch withdrawn before it landed leaves nothing behind."""
        self.on_evict(view, unit)

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]) -> VictimChoice:
        """The candidate of fewest uses, then of the oldest last use."""
        return min(candidates, key=lambda k: (self.uses.get(k, 0), self.last.get(k, 0)))


@register
class LfuPrefetch(Composed):
    """:class:`FewestUses` + speculative prefetch of the next layer's ``prefetch_experts`` experts."""

    name = "lfu-prefetch"
    summary = "LFU + next-layer prefetch (plugin example)"
    # what it needs to run as meant: studies mark it n/a on a trace without the lookahead
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}),
                             source="the next layer's router on the current hidden state")

    def __init__(self, *, prefetch_experts: int = 2, predictor: str = "auto") -> None:
        self.prefetch_experts = prefetch_experts   # every parameter is kept as given, under its name
        self.predictor = predictor
        self.assemble(cache=FewestUses(),
                      prefetcher=NextLayerPrefetcher(make_predictor(predictor), experts=prefetch_experts))

    def needs(self) -> SetupNeeds:
        """``predictor: previous-token`` reads no lookahead."""
        needs = super().needs()
        return needs.without(columns={"lookahead_logits"}) if self.predictor == "previous-token" else needs
