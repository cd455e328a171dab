"""When serving requests arrive and how long they are: a seeded Poisson process
(``workload.arrivals.rate``) or a request log (``workload.arrivals.file``, CSV or Parquet with
columns ``arrival_s``, ``prompt_tokens`` and ``output_tokens``). A bad log is one line naming
the file, the row and the column."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.escape import visible

LOG_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
"""The columns of a request log, in this order of meaning: arrival time in seconds from the
start of the run, prompt tokens, output tokens (the first from the prompt's iteration)."""


@dataclass(frozen=True)
class Arrivals:
    """Requests in arrival order: their arrival times (seconds) and, from a log, their prompt and
    output lengths (None: each request takes its trace request's own)."""

    times: np.ndarray
    prompt: np.ndarray | None = None
    output: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.times)


def poisson_arrivals(rate: float, n: int, seed: int) -> Arrivals:
    """``n`` arrivals of a Poisson process of ``rate`` per second starting at 0: exponential
    gaps of mean 1 / rate from a stream seeded by ``seed`` (the first request arrives at 0, so
    that a run does not start with an idle GPU)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E7F]))
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return Arrivals(np.cumsum(gaps))


def read_arrivals(path: Path) -> Arrivals:
    """The requests of the log at ``path`` (``.csv`` or ``.parquet``), sorted by arrival (ties
    keep the file's order). Missing file or column, a non-number, a negative or non-finite
    arrival, a prompt below 0 or an output below 1: one line naming the file, row and column."""
    import pandas as pd

    name = visible(str(path))
    if not path.is_file():
        raise MoesimError(f"workload.arrivals.file: {name} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            df = pd.read_csv(path)
        elif suffix == ".parquet":
            df = pd.read_parquet(path)
        else:
            raise MoesimError(f"workload.arrivals.file: {name}: expected a .csv or .parquet file")
    except MoesimError:
        raise
    except Exception as exc:   # pandas and pyarrow raise many kinds for an unreadable file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MoesimError(f"workload.arrivals.file: {name}: cannot be read ({visible(first)})") from None
    for col in LOG_COLUMNS:
        if col not in df.columns:
            raise MoesimError(f"workload.arrivals.file: {name}: missing column {col!r} "
                              f"(expected {', '.join(LOG_COLUMNS)})")
    if len(df) == 0:
        raise MoesimError(f"workload.arrivals.file: {name}: no requests")
    cols = {}
    for col in LOG_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if col == "arrival_s":
            bad |= values < 0
        else:
            bad |= (values != np.floor(values)) | (values < (1 if col == "output_tokens" else 0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            want = {"arrival_s": "a finite number of seconds >= 0", "prompt_tokens": "a whole number >= 0",
                    "output_tokens": "a whole number >= 1"}[col]
            raise MoesimError(f"workload.arrivals.file: {name}: row {row + 1}, column {col}: "
                              f"{visible(df[col].iloc[row])!s} is not {want}")
        cols[col] = values
    order = np.argsort(cols["arrival_s"], kind="stable")
    times = cols["arrival_s"][order]
    prompt = cols["prompt_tokens"][order].astype(np.int64)
    output = cols["output_tokens"][order].astype(np.int64)
    return Arrivals(times, prompt, output)
