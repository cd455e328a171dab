"""A serving workload (``workload.arrivals``): which trace rows each arriving request replays,
fixed before the run; which iterations they form is decided during the run by
:mod:`moesim.sim.engine.scheduler`, since it depends on when the GPU frees.

How requests map to the trace: request ``i`` (in arrival order) replays the ``i % R``-th of the
``R`` trace requests the workload selects (``workload.requests``, after any profile split).
With ``arrivals.rate`` it replays that trace request's rows as recorded: its prompt rows (when
``prefill`` is in ``workload.phases``) and its decode rows (when ``decode`` is). With
``arrivals.file`` the log's lengths win: a prompt of ``p`` tokens replays the trace request's
prompt rows cycled to ``p`` rows (its decode rows when it has none), and ``o`` output tokens
replay its decode rows cycled to ``o - 1`` rows (the prompt's iteration gives the first output
token; ``o`` rows when the prompt is not replayed); the rows are numpy's ``resize`` of the
request's rows. The prompt runs only when ``prefill`` is in ``workload.phases``.

Output tokens: the iteration that completes a request's prompt gives its first token, and each
decode iteration one more (as in the lockstep replay)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.arrivals import Arrivals
from moesim.traces.format.trace_file import DECODE, PREFILL, Trace


@dataclass(frozen=True)
class ServingPlan:
    """The requests of a serving run, fixed before it: arrival times, the trace rows (layer-0
    row of each token) of each one's prompt and decode tokens, the trace request each replays,
    the scheduler's settings, the starting context (``context_tokens``, 0 included) and whether
    the KV cache is modelled (``kv_modelled``: the model gives an attention shape; a serving run
    then models it whatever the starting context)."""

    arrival: np.ndarray                  # seconds, non-decreasing
    prompt_rows: tuple[np.ndarray, ...]  # per request: layer-0 rows of its prompt tokens (may be empty)
    decode_rows: tuple[np.ndarray, ...]  # per request: layer-0 rows of its decode tokens (may be empty)
    trace_request: np.ndarray            # per request: the trace request it replays
    kind: str                            # static | continuous
    max_batch: int
    max_tokens: int
    context_tokens: int
    kv_modelled: bool                    # attention reads and the KV cache in VRAM (the model's attention shape is known)
    embedding_rows: frozenset[int]       # trace rows that carry an embedding

    @property
    def n(self) -> int:
        """Requests served."""
        return len(self.arrival)

    def outputs(self, r: int) -> int:
        """Output tokens of request ``r``: one from its prompt (when it has one) and one per decode token."""
        return (1 if len(self.prompt_rows[r]) else 0) + len(self.decode_rows[r])

    def kv_total(self, r: int) -> int:
        """Tokens of KV cache request ``r`` holds at its end: the starting context, its prompt and its decode tokens."""
        return self.context_tokens + len(self.prompt_rows[r]) + len(self.decode_rows[r])

    def peak_kv_tokens(self) -> int:
        """An upper bound of the KV tokens live at any instant (0 when the KV cache is not modelled):
        at most ``max_batch`` requests run at once, each holding at most its end's KV, so the sum
        of the ``max_batch`` largest ends. The run's VRAM keeps that much for the KV cache."""
        if not self.kv_modelled:
            return 0
        ends = sorted((self.kv_total(r) for r in range(self.n)), reverse=True)
        return sum(ends[:self.max_batch])

    def all_rows(self) -> np.ndarray:
        """The layer-0 row of every token served (requests in arrival order, prompt then decode):
        what the run replays, in some order."""
        parts = [a for r in range(self.n) for a in (self.prompt_rows[r], self.decode_rows[r])]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def build_plan(trace: Trace, chosen: Sequence[int], phases: Sequence[str], arrivals: Arrivals, *, kind: str,
               max_batch: int, max_tokens: int, context_tokens: int, kv_modelled: bool) -> ServingPlan:
    """The :class:`ServingPlan` of ``arrivals`` over the trace requests ``chosen`` (see the module
    for the mapping; ``kv_modelled``: the model gives an attention shape, so the requests' KV
    cache is read and held); a request left with no token to run is one line naming it."""
    L = trace.model.num_layers
    rows0 = np.arange(0, trace.num_rows, L)
    req = trace.request_id[rows0]
    ph = trace.phase[rows0]
    want_prefill, want_decode = "prefill" in phases, "decode" in phases
    pools: list[tuple[np.ndarray, np.ndarray]] = []
    for r in chosen:
        m = req == r
        pools.append((rows0[m & (ph == PREFILL)].astype(np.int64), rows0[m & (ph == DECODE)].astype(np.int64)))
    if not pools:
        raise MoesimError("workload.arrivals: no trace request to replay")
    prompt: list[np.ndarray] = []
    decode: list[np.ndarray] = []
    n = len(arrivals)
    empty = np.zeros(0, dtype=np.int64)
    for i in range(n):
        pre, dec = pools[i % len(pools)]
        if arrivals.prompt is None or arrivals.output is None:
            p_rows = pre if want_prefill else empty
            d_rows = dec if want_decode else empty
        else:
            src_p = pre if len(pre) else dec
            src_d = dec if len(dec) else pre
            p = int(arrivals.prompt[i]) if want_prefill else 0
            o = int(arrivals.output[i]) - (1 if p else 0)
            p_rows = np.resize(src_p, p).astype(np.int64) if p else empty
            d_rows = np.resize(src_d, o).astype(np.int64) if o > 0 else empty
        if not len(p_rows) and not len(d_rows):
            raise MoesimError(f"workload.arrivals: request {i} (trace request {chosen[i % len(pools)]}) has no token "
                              f"to replay in phases {list(phases)}")
        prompt.append(p_rows)
        decode.append(d_rows)
    emb = frozenset(int(x) for x in trace.embedding_rows) if trace.embedding_rows is not None else frozenset()
    return ServingPlan(arrival=np.asarray(arrivals.times, dtype=np.float64), prompt_rows=tuple(prompt),
                       decode_rows=tuple(decode),
                       trace_request=np.array([chosen[i % len(pools)] for i in range(n)], dtype=np.int64),
                       kind=kind, max_batch=max_batch, max_tokens=max_tokens, context_tokens=context_tokens,
                       kv_modelled=kv_modelled, embedding_rows=emb)
