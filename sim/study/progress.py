"""Progress of a sweep or comparison: a bar on a terminal, plain lines elsewhere.

A study can take minutes; off a terminal (a log, CI, a notebook cell) the bar would be noise,
so :func:`progress` prints one line every few points instead::

    compare-quickstart: 12/40 points, 3 n/a, 1 failed; 10.2 s elapsed, about 23 s left

The estimate is the mean wall time of the points finished in this call times the points left
(divided among the workers by the pool itself: the mean already reflects it). ``n/a`` points
(policies that cannot run as their paper meant it here) are counted apart from failed ones, in
the bar and in the lines alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

NOT_APPLICABLE = "n/a"
MODES = ("bar", "lines", "off")
"""How progress is shown: a rich bar, one plain line per few points, or nothing."""


class Counts:
    """Points finished, failed and n/a so far, and the estimate of the time left."""

    def __init__(self, total: int, done: int, n_a: int) -> None:
        self.total, self.done, self.n_a, self.failed = total, done, n_a, 0
        self.start_done = done
        self.t0 = time.perf_counter()

    def add(self, rec: dict[str, Any]) -> None:
        """Count one finished point's record."""
        self.done += 1
        status = rec.get("status")
        if status == NOT_APPLICABLE:
            self.n_a += 1
        elif status != "ok":
            self.failed += 1

    def elapsed(self) -> float:
        """Seconds since the study began running points."""
        return time.perf_counter() - self.t0

    def eta(self) -> float | None:
        """Seconds left, from the points finished in this call (None before the first)."""
        ran = self.done - self.start_done
        if ran <= 0:
            return None
        return self.elapsed() / ran * (self.total - self.done)

    def tally(self) -> str:
        """``3 n/a, 1 failed`` (only the non-zero parts)."""
        parts = [f"{self.n_a} n/a"] if self.n_a else []
        return ", ".join(parts + ([f"{self.failed} failed"] if self.failed else []))

    def line(self, name: str) -> str:
        """One progress line."""
        tally = self.tally()
        eta = self.eta()
        left = "" if eta is None else f", about {format_seconds(eta)} left"
        return (f"{name}: {self.done}/{self.total} points{', ' + tally if tally else ''}; "
                f"{self.elapsed():.1f} s elapsed{left}")


def format_seconds(s: float) -> str:
    """``42 s``, ``3 min 5 s`` or ``1 h 2 min``."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def line_every(total: int) -> int:
    """Points between two progress lines: about twenty lines for a study, at least one point."""
    return max(1, total // 20)


@contextmanager
def progress(mode: str, name: str, total: int, done: int, n_a: int,
             stream: TextIO | None = None) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A callback to call with each finished point's record, showing progress as ``mode`` says
    (:data:`MODES`); ``done`` points are finished before it starts, ``n_a`` of them n/a."""
    counts = Counts(total, done, n_a)
    if mode == "off":
        yield counts.add
        return
    if mode == "lines":
        out = stream or sys.stderr
        every = line_every(total)

        def line(rec: dict[str, Any]) -> None:
            counts.add(rec)
            if (counts.done - counts.start_done) % every == 0 or counts.done == counts.total:
                print(counts.line(name), file=out, flush=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("points"),
                  TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(name, total=total, completed=done, tally=counts.tally())

        def tick(rec: dict[str, Any]) -> None:
            counts.add(rec)
            tally = counts.tally()
            bar.update(task, advance=1, tally=f"[red]{tally}" if counts.failed else tally)

        yield tick
