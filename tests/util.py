"""Small hand-made traces, models and hardware for the engine and policy tests (the ones a
plugin author can use too live in :mod:`moesim.testing.fixtures`; they are re-exported here)."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.records import STEP_FIELDS
from moesim.testing.fixtures import (
    EXPERT_BYTES,
    make_trace,
    random_trace,
    run_engine,
    swap_last_tokens,
    tiny_hw,
    tiny_model,
)
from moesim.traces.format.trace_file import DECODE, PREFILL, Trace

__all__ = ["DECODE", "EXPERT_BYTES", "PREFILL", "ROOT", "Step", "assert_same_replays", "assert_same_trace", "make_trace", "random_trace", "run_engine",
           "step_us", "steps", "swap_last_tokens", "tiny_hw", "tiny_model"]

ROOT = Path(__file__).resolve().parents[1]


Step = namedtuple("Step", [name for name, _ in STEP_FIELDS])  # type: ignore[misc]


def steps(engine: Engine) -> list[Any]:
    """The engine's step records as named tuples (seconds), in order."""
    cols = engine.state.steps.columns()
    n = len(cols["iteration"])
    return [Step(*(cols[name][i].item() for name, _ in STEP_FIELDS)) for i in range(n)]


def step_us(engine: Engine) -> list[float]:
    """Duration of every (iteration, layer) step in microseconds, rounded to 1e-6 us."""
    return [round((s.t_end - s.t_start) * 1e6, 6) for s in steps(engine)]


def assert_same_trace(a: Trace, b: Trace) -> None:
    """Two traces hold the same metadata and the same values in every column."""
    assert a.meta == b.meta
    for name, col in a.columns().items():
        other = b.columns().get(name)
        assert other is not None, name
        np.testing.assert_array_equal(col, other, err_msg=name)
    assert set(a.columns()) == set(b.columns())


def assert_same_replays(slow: Engine, ms: dict[str, Any], fast: Engine, mf: dict[str, Any],
                        what: str = "") -> None:
    """Two replays of one run (the event loop's and a fast one's) computed the same: equal metrics
    once ``engine_path`` and ``engine_path_reason`` (which replay ran, and why) are popped from both
    dicts, in place, and equal step records, column by column (``what`` prefixes the column named
    in a failure)."""
    for m in (ms, mf):
        m.pop("engine_path")
        m.pop("engine_path_reason")
    assert mf == ms, {k: (ms[k], mf.get(k)) for k in ms if ms[k] != mf.get(k)}
    cs, cf = slow.state.steps.columns(), fast.state.steps.columns()
    for name in cs:
        np.testing.assert_array_equal(cf[name], cs[name], err_msg=f"{what}{name}")
