"""Progress of ``simctl fit`` on stderr: a rich bar on a terminal, plain lines elsewhere.

A fit runs the simulator hundreds or thousands of times in phases whose sizes are known when
each phase starts: the first run of every row, the coarse grid, the refinement of each
independent group of values, the leave-one-out refits and the final runs. Each phase is shown
with its own count and an estimate of the time it has left (its mean time per item so far
times the items left); the simulator runs done so far are counted beside it::

    fit eliseev-mazur-2023-table2: coarse grid 120/300 runs; 210 runs in all; 4.1 s elapsed, about 6 s left

The refinement's items are groups (a least-squares search does not know its length in
advance), so its estimate is per group finished.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from moesim.sim.study.progress import format_seconds, line_every

MODES = ("bar", "lines", "off")
"""How fit progress is shown: a rich bar, a plain line every few items, or nothing."""


class FitProgress:
    """Phases of a fit with their counts (see the module); :meth:`runs` is told of every
    simulator run, :meth:`advance` of every item of the current phase."""

    def __init__(self, name: str, mode: str = "lines", stream: TextIO | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.name, self.mode = name, mode
        self.stream = stream or sys.stderr
        self.t_start = time.perf_counter()
        self.total_runs = 0
        self.phase_name, self.unit, self.total, self.done = "", "runs", 0, 0
        self.t_phase = self.t_start
        self._every = 1
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> FitProgress:
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}; {task.fields[runs]} runs in all"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=False)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def phase(self, name: str, total: int, unit: str = "runs") -> None:
        """Start a phase of ``total`` items (``unit``: runs or groups, refits)."""
        self.phase_name, self.unit, self.total, self.done = name, unit, max(0, total), 0
        self.t_phase = time.perf_counter()
        self._every = line_every(self.total)
        if self._bar is not None:
            self._task = self._bar.add_task(f"{self.name}: {name}", total=self.total, unit=unit,
                                            runs=self.total_runs)
        elif self.mode == "lines" and self.total == 0:
            self._line()

    def advance(self, n: int = 1) -> None:
        """``n`` items of the current phase are finished."""
        self.done = min(self.total, self.done + n)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, runs=self.total_runs)
        elif self.mode == "lines" and (self.done % self._every == 0 or self.done == self.total):
            self._line()

    def runs(self, n: int = 1) -> None:
        """``n`` simulator runs are finished (and, in a phase counted in runs, as many items)."""
        self.total_runs += n
        if self.unit == "runs":
            self.advance(n)
        elif self._bar is not None and self._task is not None:
            self._bar.update(self._task, runs=self.total_runs)

    def eta(self) -> float | None:
        """Seconds the current phase has left (None before its first item)."""
        if self.done <= 0:
            return None
        return (time.perf_counter() - self.t_phase) / self.done * (self.total - self.done)

    def line(self) -> str:
        """The progress as one plain line."""
        eta = self.eta()
        left = "" if eta is None or self.done >= self.total else f", about {format_seconds(eta)} left"
        return (f"fit {self.name}: {self.phase_name} {self.done}/{self.total} {self.unit}; {self.total_runs} runs "
                f"in all; {time.perf_counter() - self.t_start:.1f} s elapsed{left}")

    def _line(self) -> None:
        print(self.line(), file=self.stream, flush=True)
