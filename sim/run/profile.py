"""The profiling split: routing of requests that policies may study before the run (offline
statistics: co-activation, expert maps, hotness) and that is never measured.

:func:`profile_from_trace` packs the chosen requests of a trace into a
:class:`~moesim.policies.contract.base.Profile` (per-token arrays), and :func:`trace_requests` lists a
trace's requests in order, so the runner can replay the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.policies.contract.base import Profile
from moesim.traces.format.trace_file import DECODE, Trace


def trace_requests(trace: Trace) -> list[int]:
    """The trace's request ids in order of first appearance."""
    L = trace.model.num_layers
    req = trace.request_id[np.arange(0, trace.num_rows, L)]
    return list(dict.fromkeys(req.tolist()))


def profile_from_trace(trace: Trace, requests: Sequence[int], source: str) -> Profile:
    """Per-token arrays of ``requests`` of ``trace``: a prefill is one iteration, each decode
    token its own."""
    L = trace.model.num_layers
    rows0 = np.arange(0, trace.num_rows, L)
    sel = np.isin(trace.request_id[rows0], np.asarray(list(requests), dtype=np.int64))
    r0 = rows0[sel]
    idx = r0[:, None] + np.arange(L)[None, :]

    def take(col: np.ndarray | None) -> np.ndarray | None:
        return None if col is None else col[idx]

    phase = trace.phase[r0].astype(np.int8)
    req = trace.request_id[r0].astype(np.int64)
    # iteration ids: a new one at every decode token and at every request's prefill start
    new = np.ones(len(r0), dtype=bool)
    if len(r0) > 1:
        same_prefill = (req[1:] == req[:-1]) & (phase[1:] != DECODE) & (phase[:-1] != DECODE)
        new[1:] = ~same_prefill
    iteration = np.cumsum(new) - 1
    emb = None
    if trace.embedding is not None and trace.embedding_rows is not None:
        first_rows = r0[new]
        pos = np.searchsorted(trace.embedding_rows, first_rows)
        ok = (pos < len(trace.embedding_rows)) & (trace.embedding_rows[np.minimum(pos, len(trace.embedding_rows) - 1)] == first_rows)
        if ok.all():
            emb = trace.embedding[pos]
    return Profile(
        experts=trace.experts[idx], weights=take(trace.weights), logits=take(trace.logits),
        lookahead_logits=take(trace.lookahead_logits), request_id=req, phase=phase,
        iteration=iteration, embedding=emb, source=source,
    )
