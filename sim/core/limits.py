"""Size limits against absurd inputs, each overridable by an environment variable.

A 50 MB scenario file, a grid of a million points or a trace whose metadata is a 50 MB string
is almost surely a mistake; moesim stops at once with one line that names the limit and how to
lift it (``MOESIM_MAX_...=N``, 0 for no limit) instead of running for an hour or flooding the
terminal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from moesim.sim.core.errors import MoesimError


class LimitError(MoesimError, ValueError):
    """An input over a size limit; the message says how to raise the limit."""


@dataclass(frozen=True)
class Limit:
    """A limit: its environment variable, default and what it counts."""

    env: str
    default: int
    unit: str

    def value(self) -> int | None:
        """The limit in force (None: no limit, ``0`` given). A value that is not a whole number
        is one line naming the variable."""
        text = os.environ.get(self.env)
        if text is None or not text.strip():
            return self.default
        try:
            n = int(text)
        except ValueError:
            raise LimitError(f"{self.env}={text!r}: expected a whole number of {self.unit} (0: no limit)") from None
        if n < 0:
            raise LimitError(f"{self.env}={text!r}: expected a whole number of {self.unit} >= 0 (0: no limit)")
        return n or None

    def check(self, size: int, what: str) -> None:
        """Refuse ``size`` over the limit with one line about ``what``."""
        cap = self.value()
        if cap is not None and size > cap:
            raise LimitError(f"{what}: {size:,} {self.unit}, over the limit of {cap:,}; if that is meant, "
                             f"set {self.env}={size} (or 0 for no limit)")

    def shorten(self, text: str) -> str:
        """``text`` cut to the limit, saying how much was left out and how to see it all."""
        cap = self.value()
        if cap is None or len(text) <= cap:
            return text
        return f"{text[:cap]}... ({len(text) - cap:,} more {self.unit}; {self.env}=0 prints all)"


YAML_BYTES = Limit("MOESIM_MAX_YAML_BYTES", 4 * 1024 * 1024, "bytes")
"""Largest scenario, sweep or profile YAML file read."""

SWEEP_POINTS = Limit("MOESIM_MAX_POINTS", 100_000, "points")
"""Most points of one sweep, comparison or advice."""

PRINTED_METADATA = Limit("MOESIM_MAX_PRINTED", 2_000, "characters")
"""Longest metadata text (a trace's model name, its source) printed by ``simctl trace inspect``."""
