"""fMoE's cache rule keeps its victim keys incrementally (policies/fmoe/map_cache.py): on random
sequences of executions, issues, departures, changes of the maps' p and eviction requests, every
victim is the one the rule's definition gives from scratch (the highest ``1 / (p * (freq + s))``,
ties to the lowest unit, outside the maps' window unless a demand load finds nothing else)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from moesim.policies.contract.base import Decline, EvictionRequest, Reason, UnitKey
from moesim.policies.fmoe.map_cache import MapPriorityCache

L, J = 3, 4
UNITS = [(layer, e, 0) for layer in range(L) for e in range(J)]
PS = [0.0, 0.05, 0.1, 0.25, 0.5, 1.0]   # few values, a zero among them: ties and infinite priorities


class Maps:
    """The part of the map prefetcher the cache rule reads: p (``p_map``, replaced when it
    changes; float32 as a matched map's, or float64) and the protected window."""

    def __init__(self, rows: list[list[float]], dtype: Any) -> None:
        self.dtype = dtype
        self.win: frozenset[UnitKey] = frozenset()
        self.match(rows)

    def match(self, rows: list[list[float]]) -> None:
        """A new match: ``p_map`` replaced; ``rows``: its numbers as Python floats."""
        self.p_map = np.array(rows, dtype=self.dtype)
        self.rows = self.p_map.tolist()

    def p_evict(self, layer: int, expert: int) -> float:
        return self.rows[layer][expert]

    def window(self) -> frozenset[UnitKey]:
        return self.win


def rows_of(flat: list[float]) -> list[list[float]]:
    return [flat[layer * J:(layer + 1) * J] for layer in range(L)]


def expected(cands: list[UnitKey], rows: list[list[float]], freq: dict[UnitKey, int], smoothing: float,
             window: frozenset[UnitKey], protect: bool, reason: Reason) -> Any:
    """The victim by the rule's definition, over every candidate's key computed now."""
    pool = [k for k in cands if k not in window] if protect else list(cands)
    if not pool and reason is Reason.DEMAND:
        pool = list(cands)
    if not pool:
        return Decline.WAIT if reason is Reason.DEMAND else Decline.GIVE_UP

    def key(k: UnitKey) -> tuple[float, int, int, int]:
        den = rows[k[0]][k[1]] * (freq.get(k, 0) + smoothing)
        return (1.0 / den if den > 0 else float("inf"), -k[0], -k[1], -k[2])
    return max(pool, key=key)


unit = st.sampled_from(UNITS)
# p: few values (ties, a zero: infinite priorities) or any in [0, 1] (rounded to float32 or not)
prob = st.one_of(st.sampled_from(PS), st.floats(0.0, 1.0))
step = st.one_of(
    st.tuples(st.just("access"), st.integers(0, L - 1), st.lists(st.integers(0, J - 1), min_size=1, max_size=J,
                                                                 unique=True)),
    st.tuples(st.just("issue"), unit),
    st.tuples(st.just("evict"), unit),
    st.tuples(st.just("cancel"), unit),
    st.tuples(st.just("p"), st.lists(prob, min_size=L * J, max_size=L * J)),
    # candidates: those of the units the rule knows (executed or issued, still there) that a mask
    # picks, and a few it does not know (e.g. loaded by another prefetcher)
    st.tuples(st.just("victim"), st.integers(0, 2 ** len(UNITS) - 1), st.lists(unit, max_size=2, unique=True),
              st.frozensets(unit, max_size=4), st.sampled_from([Reason.DEMAND, Reason.PREFETCH])),
)


@given(smoothing=st.sampled_from([0.0, 1.0, 0.5, 2]), protect=st.booleans(),
       first=st.lists(prob, min_size=L * J, max_size=L * J), steps=st.lists(step, min_size=20, max_size=80),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_every_victim_is_the_highest_key_computed_afresh(smoothing: float, protect: bool, first: list[float],
                                                         steps: list[tuple[Any, ...]], dtype: Any) -> None:
    maps = Maps(rows_of(first), dtype)
    cache = MapPriorityCache(smoothing, protect, maps=maps)  # type: ignore[arg-type]
    cache.setup(SimpleNamespace(num_experts=J))  # type: ignore[arg-type]
    freq: dict[UnitKey, int] = {}   # the reference's own counts
    known: set[UnitKey] = set()   # executed or issued, not gone since
    for s in steps:
        if s[0] == "access":
            cache.on_access(None, s[1], SimpleNamespace(experts=s[2]))  # type: ignore[arg-type]
            for e in s[2]:
                freq[(s[1], e, 0)] = freq.get((s[1], e, 0), 0) + 1
                known.add((s[1], e, 0))
        elif s[0] == "issue":
            cache.refresh(s[1])
            known.add(s[1])
        elif s[0] in ("evict", "cancel"):
            (cache.on_evict if s[0] == "evict" else cache.on_cancel)(None, s[1])  # type: ignore[arg-type]
            freq.pop(s[1], None)
            known.discard(s[1])
        elif s[0] == "p":   # a new match: p replaced
            maps.match(rows_of(s[1]))
        else:
            mask, extra, maps.win, reason = s[1:]
            cands = [u for i, u in enumerate(UNITS) if u in known and mask >> i & 1]
            cands += [u for u in extra if u not in cands]
            if not cands:
                continue
            got = cache.choose_victim(None, EvictionRequest(reason, (0, 0, 0), 0, 1, cands))  # type: ignore[arg-type]
            assert got == expected(cands, maps.rows, freq, smoothing, maps.win, protect, reason)
            if not isinstance(got, Decline):   # the engine evicts it
                cache.on_evict(None, got)  # type: ignore[arg-type]
                freq.pop(got, None)
                known.discard(got)
