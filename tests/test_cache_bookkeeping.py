""":class:`~moesim.policies.parts.caches.LRUCache` keeps only last uses and
:class:`~moesim.policies.parts.caches.LFUCache` only counts and last uses; their victims, clocks,
last uses (and LFU's counts) must be those of the same rule over the full
:class:`~moesim.policies.parts.caches.RecencyCache` bookkeeping (the insertion times and counts
they skip were never read), on random sequences of accesses, refreshes, evictions, withdrawals
and victim requests, protected sets included."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.policies.contract.base import EvictionRequest, ReadView, Reason, UnitKey, VictimChoice
from moesim.policies.parts.caches import CacheRule, LFUCache, LRUCache, RecencyCache


class _FullLRU(RecencyCache):
    """LRU over the full bookkeeping, as LRUCache was before it kept only last uses."""

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]) -> VictimChoice:
        last = self._last
        return min(candidates, key=lambda k: last.get(k, 0))


class _FullLFU(RecencyCache):
    """LFU over the full bookkeeping, as LFUCache was before it dropped insertion times."""

    victim = LFUCache.victim


_KEYS = [(layer, e, 0) for layer in range(2) for e in range(4)]
_OPS = st.lists(st.tuples(st.sampled_from(["access", "refresh", "evict", "cancel", "victim"]),
                          st.lists(st.sampled_from(_KEYS), min_size=1, max_size=4),
                          st.lists(st.sampled_from(_KEYS), max_size=2)), max_size=60)


@pytest.mark.parametrize(("lean_cls", "full_cls"), [(LRUCache, _FullLRU), (LFUCache, _FullLFU)])
@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_lean_rule_answers_as_the_full_bookkeeping(lean_cls: type[RecencyCache], full_cls: type[CacheRule],
                                                   ops: list[tuple[str, list[UnitKey], list[UnitKey]]]) -> None:
    lean, full = lean_cls(), full_cls()
    assert isinstance(full, RecencyCache)
    ctx = SimpleNamespace()
    for c in (lean, full):
        c.setup(ctx)   # type: ignore[arg-type]
        c.part_fractions = lambda layer: (1.0,)   # type: ignore[method-assign]
    for op, keys, protected in ops:
        for c in (lean, full):
            if op == "access":   # one layer's experts, in order
                layer = keys[0][0]
                c.on_access(None, layer, SimpleNamespace(experts=[e for lay, e, _ in keys if lay == layer]))   # type: ignore[arg-type]
            elif op == "refresh":
                for k in keys:
                    c.refresh(k)
            elif op == "evict":
                c.on_evict(None, keys[0])   # type: ignore[arg-type]
            elif op == "cancel":
                c.on_cancel(None, keys[0])   # type: ignore[arg-type]
        if op == "victim":
            req = EvictionRequest(Reason.PREFETCH, keys[0], 0, 1, tuple(dict.fromkeys(keys)))
            answers = []
            for c in (lean, full):
                c.protected = frozenset(protected)
                answers.append(c.choose_victim(None, req))   # type: ignore[arg-type]
                c.protected = frozenset()
            assert answers[0] == answers[1]
        assert lean.clock == full.clock
        assert lean.last_uses() == full.last_uses()
        if isinstance(lean, LFUCache):
            assert lean._count == full._count
