"""System pairs: which published system a set's rows say is faster, and whether moesim agrees.

Two held-out rows of one measurement set form a system pair when both declare a published
system (``system:``, the file's or the row's; ``measurements/README.md``), the systems differ,
both measure the same metric as absolute values (no ``relative_to``), both run the same model
and the same GPU (the ``base`` names of their ``model`` and ``hardware`` keys; a width or a
host figure of a system's own may differ, as each system runs its own kernels), and their
measured values are more than 1% apart. A pair is right when the predictions order the two
rows as the measurements do (never with an undefined prediction or a tie). This is the
cross-system ordering a reader choosing a system needs (kTransformers, llama.cpp and Fiddler on
one server, ``ktransformers-sosp25-decode``); the scoreboard's ranking pairs compare policies
on one setup and do not see it (the systems' rows differ by runtime and host, not by policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.scoreboard_rows import Row, measured_apart, ordered_right


def _base_name(value: Any) -> Any:
    """A ``model`` / ``hardware`` value's catalog name (its ``base`` when it is a mapping)."""
    return value.get("base") if isinstance(value, dict) else value


def system_pairs(rows: Sequence[Row]) -> list[tuple[Row, Row, bool]]:
    """Every system pair of one set's rows (see the module docstring) and whether it is right."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if (a.role, b.role) != ("test", "test") or None in (a.declared, b.declared) or a.declared == b.declared:
                continue
            if a.metric != b.metric or a.relative_to is not None or b.relative_to is not None:
                continue
            if any(_base_name(a.set.get(k)) != _base_name(b.set.get(k)) for k in ("model", "hardware")):
                continue
            if measured_apart(a, b):
                out.append((a, b, ordered_right(a, b)))
    return out
