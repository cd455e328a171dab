"""What a run records: raw counters (:class:`RunStats`), per-step records kept in columns
(:class:`StepRecords`) and the opt-in timeline of GPU, CPU and copy-lane activity.

Everything here is plain data (numbers, lists, numpy arrays): a finished run pickles, so a
sweep worker can send it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("iteration", "int32"),
    ("layer", "int16"),
    ("t_start", "float64"),      # seconds: before_layer
    ("t_route", "float64"),      # routing known
    ("t_end", "float64"),        # the layer's experts computed
    ("n_experts", "int16"),      # distinct experts run on the GPU
    ("hits", "int16"),
    ("late", "int16"),
    ("partial", "int16"),
    ("misses", "int16"),
    ("cpu_experts", "int16"),    # distinct experts run on the CPU
    ("stall_s", "float64"),      # GPU waiting for transfers (blocking I/O)
    ("demand_bytes", "int64"),
    ("prefetch_bytes", "int64"),
    ("evictions", "int32"),
)
"""Columns of the per-(iteration, layer) step records and their types."""

STEP_CHUNK = 1 << 15
"""Rows kept as tuples before they are packed into a numpy chunk."""


class StepRecords:
    """Per (iteration, layer) records, appended as tuples on the hot path and packed into
    numpy columns every few thousand steps (bounded memory, no per-row objects).

    A hot loop may append to :attr:`rows` itself, calling :meth:`pack` (then re-reading
    :attr:`rows`) once it holds :data:`STEP_CHUNK` rows, as :meth:`append` does.

    The records are held once, as one array per field with room to grow (:meth:`reserve`
    makes room for the steps a run will record, so that nothing grows), and :meth:`columns`
    hands out views of them: a 3M-step run holds ~200 MB of records, not that as packed
    chunks and again as their concatenation."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._cols: dict[str, np.ndarray] = {name: np.empty(0, dtype=dtype) for name, dtype in STEP_FIELDS}
        self._n = 0   # steps packed into the columns

    def reserve(self, n: int) -> None:
        """Make room for ``n`` steps in all (a run knows how many it will record: iterations x
        layers); more may still be appended."""
        if n > len(self._cols["iteration"]):
            self._grow_to(n)

    def _grow_to(self, cap: int) -> None:
        n = self._n
        for name, dtype in STEP_FIELDS:
            col = np.empty(cap, dtype=dtype)
            col[:n] = self._cols[name][:n]
            self._cols[name] = col   # the old one is dropped before the next field grows

    def _room(self, n: int) -> int:
        """Make room for ``n`` more steps; the index of the first."""
        at = self._n
        if at + n > len(self._cols["iteration"]):
            self._grow_to(max(at + n, 2 * len(self._cols["iteration"]), STEP_CHUNK))
        self._n = at + n
        return at

    def append(self, row: tuple[Any, ...]) -> None:
        """One step, fields in :data:`STEP_FIELDS` order."""
        rows = self.rows
        rows.append(row)
        if len(rows) >= STEP_CHUNK:
            self.pack()

    def pack(self) -> None:
        """Pack the rows appended so far into the columns (:attr:`rows` is a new list after)."""
        rows = self.rows
        if rows:
            self.rows = []
            n = len(rows)
            at = self._room(n)
            # the rows turned into fields by zip, each field read into its column: a fifth
            # faster than reading the tuples as records, the same values
            for (name, dtype), values in zip(STEP_FIELDS, zip(*rows, strict=True), strict=True):
                self._cols[name][at:at + n] = np.fromiter(values, dtype=dtype, count=n)

    def extend(self, columns: dict[str, Any], n: int) -> None:
        """Append ``n`` steps given as one sequence per field (every field of
        :data:`STEP_FIELDS`), after the rows appended so far: a replay that computes whole
        blocks of steps at once adds them as one chunk."""
        self.pack()
        at = self._room(n)
        for name, _ in STEP_FIELDS:
            self._cols[name][at:at + n] = columns[name]

    def extend_layers(self, idxs: list[int], L: int, starts: list[float], step_s: list[float], ends: list[float],
                      hits: Any, late: Any, misses: Any, stalls: list[float], eb: int,
                      prefetch: Any = 0, evictions: Any = 0) -> None:
        """Append whole iterations (``idxs``) of a replay that runs no expert on the CPU and
        splits none, as columns: each iteration's start (its first layer's) and non-MoE step
        (a layer is routed that long after it starts, and starts when the one before ends);
        per step, iteration-major, its end, hit, late and missed experts (it runs their sum),
        stall, prefetch bytes and evictions (0: none); ``eb`` demand bytes per miss."""
        n = len(ends)
        t_end = np.array(ends, dtype=np.float64)
        t_start = np.empty(n, dtype=np.float64)
        t_start[1:] = t_end[:-1]
        t_start[::L] = starts
        h = np.asarray(hits, dtype=np.int64)
        lt = np.asarray(late, dtype=np.int64)
        m = np.asarray(misses, dtype=np.int64)
        zero = np.zeros(n, dtype=np.int64)
        self.extend({
            "iteration": np.repeat(np.array(idxs, dtype=np.int64), L),
            "layer": np.tile(np.arange(L, dtype=np.int64), len(idxs)),
            "t_start": t_start, "t_route": t_start + np.repeat(np.array(step_s, dtype=np.float64), L),
            "t_end": t_end, "n_experts": h + lt + m, "hits": h, "late": lt, "partial": zero,
            "misses": m, "cpu_experts": zero, "stall_s": stalls, "demand_bytes": m * eb,
            "prefetch_bytes": prefetch, "evictions": evictions,
        }, n)

    def __len__(self) -> int:
        return self._n + len(self.rows)

    def columns(self) -> dict[str, np.ndarray]:
        """All records as one contiguous numpy array per field: read-only views of the records
        (copy one to change it); steps appended later show in the next call's."""
        self.pack()
        out = {}
        for name, _ in STEP_FIELDS:
            view = self._cols[name][:self._n]
            view.flags.writeable = False
            out[name] = view
        return out


@dataclass
class RunStats:
    """Raw counters of one run; :mod:`moesim.sim.run.metrics` turns them into reported metrics."""

    hits: int = 0
    late: int = 0
    partial: int = 0
    misses: int = 0
    cpu_accesses: int = 0          # planned experts computed on the CPU (no transfer)
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    prefetch_units: int = 0
    prefetch_used: int = 0
    wasted_prefetch_bytes: int = 0
    refetch_bytes: int = 0
    aborted_prefetches: int = 0    # prefetch copies a policy stopped in flight
    aborted_bytes: int = 0         # ... the bytes they had moved (also in prefetch and wasted bytes)
    fetch_needed: int = 0          # accesses whose expert was brought in since its previous access
    fetch_covered: int = 0         # ... of which by a prefetch
    evictions: int = 0
    stall_s: float = 0.0           # GPU waiting for transfers or room: blocking I/O
    sync_stall_s: float = 0.0      # ... of which waiting for synchronous prefetches
    cpu_wait_s: float = 0.0        # GPU waiting for CPU-computed experts
    gpu_busy_s: float = 0.0
    cpu_busy_s: float = 0.0
    overhead_s: float = 0.0        # runtime overhead (per layer and per token) on the GPU stream
    policy_cpu_s: float = 0.0      # policy decisions charged on the critical path
    pcie_busy_s: float = 0.0
    d2h_bytes: int = 0             # copied back to the host (swap_out)
    d2h_busy_s: float = 0.0
    vram_peak_bytes: int = 0
    substitutions: int = 0         # slots that ran an expert the token was not routed to
    dropped: int = 0               # routed slots that ran nothing
    mass_kept_sum: float = 0.0     # sum over token-layers of the routed mass still run
    top1_kept: int = 0             # token-layers whose top-1 routed expert ran
    slots_run: int = 0             # slots that ran an expert (effective top-k numerator)
    token_layers: int = 0
    lossy_layers: int = 0          # token-layers whose plan differed from the routing
    token_end: dict[int, list[float]] = field(default_factory=dict)   # request -> output-token times
    request_start: dict[int, float] = field(default_factory=dict)
    iteration_end: list[float] = field(default_factory=list)

    def start_iteration(self, it: Any, now: float, batch_start: dict[int, float]) -> None:
        """Record the start of the requests that begin at iteration ``it``: the time their batch
        first ran (``batch_start``, filled here on the batch's first iteration)."""
        record_request_starts(self.request_start, it, now, batch_start)

    def end_iteration(self, it: Any, now: float) -> None:
        """Record that iteration ``it`` ended at ``now``: one output token for each request in it."""
        self.iteration_end.append(now)
        ids = it.request_ids.tolist()
        token_end = self.token_end
        if len(ids) == 1:   # one token (batch 1): the common case, without the loop's set-up
            ends = token_end.get(ids[0])
            if ends is None:
                token_end[ids[0]] = [now]
            else:
                ends.append(now)
            return
        for r in dict.fromkeys(ids):
            token_end.setdefault(r, []).append(now)


def record_request_starts(request_start: dict[int, float], it: Any, now: float, batch_start: dict[int, float]) -> None:
    """Into ``request_start``: the start of each request that begins at iteration ``it``, the
    time its batch first ran (``batch_start``, set to ``now`` on the batch's first iteration).
    The simulator's counters and the executor's both record starts this way."""
    start = batch_start.setdefault(it.batch, now)
    firsts = it.first_of_request.tolist()
    if len(firsts) == 1 and not firsts[0]:   # one token, not its request's first: nothing to record
        return
    for r, first in zip(it.request_ids.tolist(), firsts, strict=True):
        if first:
            request_start[r] = start


TimelineEvent = tuple[str, str, float, float, dict[str, Any]]
"""(track, label, start seconds, duration seconds, args) of one activity."""
