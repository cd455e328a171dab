"""One colour and marker per policy, the same in every figure of every command.

``simctl plot``, ``simctl compare``, ``simctl curve`` and ``simctl report`` draw each policy
with :func:`policy_style`: its place among the registered policies (:data:`FIRST`, then the
others by name) picks one of
:data:`COLORS` and one of :data:`MARKERS`, so ``lru`` is the same colour in a sweep's figure, a
comparison's bars and a report, whatever else is drawn beside it. Thirty colours, chosen to be
told apart, serve the first thirty policies, each with a marker beside it; past them a colour
comes back with another marker, so no two registered policies share both. A policy outside the
registry (a plugin not loaded here) takes a slot from a hash of its name, stable across runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache

COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
    "#0000ff", "#ff1eff", "#004b1e", "#5a00a5", "#ff0078", "#78004b", "#966900", "#96c387", "#0069ff", "#ff9678",
    "#c300a5", "#00d200", "#c369ff", "#b4b4e1", "#4b3c5a", "#781e00", "#c3a578", "#4b3c00", "#003c96", "#009678",
)
"""Thirty colours told apart in print: matplotlib's tab10, then twenty picked one by one as the
farthest (CIELAB distance) from those already chosen, among tones neither too dark nor too
pale on white; any two are at least 27 CIELAB units apart (``tests/test_figures_paper.py``)."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
"""Markers that stay distinct at print size."""


FIRST = ("lru", "lfu", "no-cache", "belady", "fifo", "random", "static", "mixtral-offloading", "moepic",
         "random-substitute")
"""The policies most often drawn together, given the ten most distinct colours (in this order)."""


@cache
def _registered() -> tuple[str, ...]:
    from moesim.policies.contract.registry import policy_names

    names = set(policy_names())
    return tuple([n for n in FIRST if n in names] + sorted(names - set(FIRST)))


def slot(name: str) -> int:
    """The policy's place in the palette: its index among the registered policies, or past them
    by a hash of its name."""
    names = _registered()
    if name in names:
        return names.index(name)
    digest = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    return len(names) + digest % (len(COLORS) * len(MARKERS))


def style_at(i: int) -> tuple[str, str]:
    """The colour and marker of palette slot ``i``: slot and slot + 30 share a colour, never a
    marker."""
    return COLORS[i % len(COLORS)], MARKERS[(i + 3 * (i // len(COLORS))) % len(MARKERS)]


def policy_style(name: str) -> tuple[str, str]:
    """The colour and marker of a policy, the same in every figure."""
    return style_at(slot(str(name)))


def styles(names: Sequence[str], *, policies: bool = True) -> dict[str, tuple[str, str]]:
    """A colour and marker per series: by policy (:func:`policy_style`) when the series are
    policies, else by order (hardware, batch sizes...)."""
    if policies:
        return {str(n): policy_style(str(n)) for n in names}
    return {str(n): style_at(i) for i, n in enumerate(names)}
