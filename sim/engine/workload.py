"""Turn a trace and a workload spec into the ordered list of iterations the engine replays.

An iteration is one forward pass: the prefill of one request (all its prompt tokens), or one
decode step of a batch (one token of each request of the batch that is still decoding).
Requests are grouped into batches of ``batch_size`` in trace order; a batch runs its
requests' prefills one after another, then decodes in lockstep; a request that runs out of
decode tokens leaves the batch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.sim.engine.serving import ServingPlan
from moesim.traces.format.trace_file import DECODE, PHASES, PREFILL, Trace


@dataclass
class Iteration:
    """One forward pass. ``rows0`` holds, per token, the trace row of its layer-0 entry; the
    row of layer ``l`` is ``rows0 + l``."""

    index: int
    phase: int
    rows0: np.ndarray
    request_ids: np.ndarray
    batch: int
    first_of_request: np.ndarray   # per token: is this the request's first iteration
    emb_row: int = -1              # row of the embedding (layer-0 row of the first token), -1 if none
    kv_tokens: int = 0             # tokens of KV cache its attention reads, over its requests (0: context not modelled)
    attn_pairs: int = 0            # (query token, context token) pairs its attention scores (prefill: quadratic)

    @property
    def n_tokens(self) -> int:
        """Tokens this iteration runs (one per request in it)."""
        return len(self.rows0)

    @property
    def phase_name(self) -> str:
        return PHASES[self.phase]


@dataclass
class Workload:
    """What a run replays: its iterations in order (or, serving, the plan its scheduler forms
    them from), the requests and the context they start with."""

    trace: Trace
    iterations: list[Iteration]
    batches: int
    requests: list[int]
    decode_tokens: int = 0
    context_tokens: int = 0
    """Tokens in each request's context before the replay (batch runs, 0: the context is not
    modelled; serving runs model their requests' own tokens whatever it is: :attr:`kv_modelled`)."""
    peak_kv_tokens: int = 0
    """Tokens of KV cache the largest batch holds at its end: per request, ``context_tokens`` plus
    every token of it replayed, summed over the batch (serving: the bound of
    :meth:`~moesim.sim.engine.serving.ServingPlan.peak_kv_tokens`; 0 when the KV cache is not
    modelled)."""
    serving: ServingPlan | None = None
    """Serving (``workload.arrivals``): the requests' arrivals and rows; the run's scheduler forms
    the iterations as the GPU frees, and ``iterations`` holds only the first. None: the lockstep
    batches of ``iterations``."""
    _future: Future | None = field(default=None, repr=False)
    _token_rows: np.ndarray | None = field(default=None, repr=False)

    @property
    def kv_modelled(self) -> bool:
        """Whether the run reads and holds a KV cache: a batch run when its starting context is
        above 0; a serving run whenever the model gives an attention shape (its requests' own
        prompt and generated tokens, from a starting context of 0 included)."""
        if self.serving is not None:
            return self.serving.kv_modelled
        return self.context_tokens > 0

    def token_rows(self) -> np.ndarray:
        """The layer-0 trace row of every token replayed, iteration by iteration (read-only;
        joined once, on the first call: every run of this workload reads the same)."""
        if self._token_rows is None:
            rows = np.concatenate([it.rows0 for it in self.iterations]) if self.iterations else np.zeros(0, dtype=np.int64)
            rows.flags.writeable = False
            self._token_rows = rows
        return self._token_rows

    def future(self) -> Future:
        if self._future is None:
            self._future = Future(self)
        return self._future


def build_workload(
    trace: Trace,
    *,
    batch_size: int = 1,
    phases: Sequence[str] = ("decode",),
    requests: str | int | Sequence[int] = "all",
    context_tokens: int = 0,
) -> Workload:
    """Select requests and phases of ``trace`` and group them into iterations; with
    ``context_tokens`` > 0, each iteration's attention reads (:func:`add_context`)."""
    if context_tokens < 0:
        raise MoesimError(f"workload.context_tokens must be >= 0, got {context_tokens}")
    if batch_size < 1:
        raise MoesimError(f"workload.batch_size must be >= 1, got {batch_size}")
    want = set()
    for p in phases:
        if p not in PHASES:
            raise MoesimError(f"workload.phases: unknown phase {p!r} (expected prefill or decode)")
        want.add(PHASES.index(p))
    L = trace.model.num_layers
    rows0 = np.arange(0, trace.num_rows, L)
    req = trace.request_id[rows0]
    ph = trace.phase[rows0]
    keep = np.isin(ph, list(want))
    present = list(dict.fromkeys(req.tolist()))
    if requests == "all":
        chosen = present
    elif isinstance(requests, int):
        if requests < 1:
            raise MoesimError(f"workload.requests must be >= 1, got {requests}")
        if requests > len(present):
            raise MoesimError(f"workload.requests: {requests} requests asked for, the trace has {len(present)}")
        chosen = present[:requests]
    else:
        ids = [int(r) for r in requests]
        twice = sorted({r for r in ids if ids.count(r) > 1})
        if twice:
            raise MoesimError(f"workload.requests: request {twice[0]} is listed twice")
        missing = [r for r in ids if r not in set(present)]
        if missing:
            raise MoesimError(f"workload.requests: request {missing[0]} is not in the trace")
        chosen = ids
    sel = keep & np.isin(req, chosen)
    if not sel.any():
        raise MoesimError(
            f"workload.phases: the workload selects no tokens (phases {list(phases)}, {len(chosen)} requests); "
            f"the trace has phases {sorted({PHASES[int(x)] for x in np.unique(ph)})}")
    tok_rows = rows0[sel]
    tok_req = req[sel]
    tok_ph = ph[sel]
    by_req: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for r in chosen:
        m = tok_req == r
        if m.any():
            rr, pp = tok_rows[m], tok_ph[m]
            by_req[r] = (rr[pp == PREFILL], rr[pp == DECODE])
    order = [r for r in chosen if r in by_req]
    iters: list[Iteration] = []
    n_decode = 0
    has_emb = trace.embedding_rows is not None and len(trace.embedding_rows) > 0
    emb_set = set(int(x) for x in trace.embedding_rows) if has_emb and trace.embedding_rows is not None else set()

    def emb(row: int) -> int:
        return row if row in emb_set else -1

    for b, start in enumerate(range(0, len(order), batch_size)):
        group = order[start:start + batch_size]
        seen: set[int] = set()
        for r in group:
            pre, _ = by_req[r]
            if len(pre):
                iters.append(Iteration(len(iters), PREFILL, pre, np.full(len(pre), r), b,
                                       np.array([True] + [False] * (len(pre) - 1)), emb(int(pre[0]))))
                seen.add(r)
        if len(group) == 1:   # one request a batch (batch_size 1, or a short last batch)
            n_decode += _decode_alone(iters, group[0], by_req[group[0]][1], b, group[0] not in seen, emb)
            continue
        decode = [(r, by_req[r][1].tolist()) for r in group]   # Python ints: no numpy scalars per row
        longest = max(len(d) for _, d in decode)
        for j in range(longest):
            rows = [d[j] for _, d in decode if j < len(d)]
            rids = [r for r, d in decode if j < len(d)]
            first = np.array([r not in seen for r in rids])
            seen.update(rids)
            iters.append(Iteration(len(iters), DECODE, np.array(rows, dtype=np.int64),
                                   np.array(rids, dtype=np.int64), b, first, emb(rows[0])))
            n_decode += len(rows)
    wl = Workload(trace=trace, iterations=iters, batches=(len(order) + batch_size - 1) // batch_size,
                  requests=order, decode_tokens=n_decode)
    if context_tokens:
        add_context(wl, context_tokens)
    return wl


def add_context(wl: Workload, context_tokens: int) -> None:
    """Give each iteration of ``wl`` what its attention reads when every request starts with
    ``context_tokens`` tokens in its context, which then grows by every token of the request
    replayed (its prefill's prompt tokens, its decoded tokens). A request that has ``n`` tokens
    in its context before an iteration that runs ``p`` of its tokens (1 when decoding) reads
    ``n + p`` tokens of KV cache and scores ``p x n + p (p + 1) / 2`` (query, context) pairs
    (each token attends to the context and to itself and the tokens before it). Sums over the
    iteration's requests go into ``kv_tokens`` and ``attn_pairs``; the largest batch's context at
    its end into ``wl.peak_kv_tokens``."""
    ctx: dict[int, int] = {}
    for it in wl.iterations:
        rids = it.request_ids.tolist()
        if it.phase == PREFILL:   # one request's prompt
            r, p = rids[0], len(rids)
            n = ctx.get(r, context_tokens)
            it.kv_tokens = n + p
            it.attn_pairs = p * n + p * (p + 1) // 2
            ctx[r] = n + p
        else:
            kv = 0
            for r in rids:
                n = ctx.get(r, context_tokens) + 1
                ctx[r] = n
                kv += n
            it.kv_tokens = it.attn_pairs = kv
    by_batch: dict[int, set[int]] = {}
    for it in wl.iterations:
        by_batch.setdefault(it.batch, set()).update(it.request_ids.tolist())
    wl.context_tokens = context_tokens
    wl.peak_kv_tokens = max((sum(ctx[r] for r in rs) for rs in by_batch.values()), default=0)


def _decode_alone(iters: list[Iteration], r: int, rows: np.ndarray, batch: int, first: bool,
                  emb: Callable[[int], int]) -> int:
    """Append the decode iterations of request ``r`` batched alone (one token each: its rows
    ``rows``), as the lockstep loop of :func:`build_workload` would make them, but as views of
    one array and with the request's id and first-flags shared: a few times faster, and no
    allocation per token. Returns the tokens added."""
    rows = np.asarray(rows, dtype=np.int64)
    rid = np.full(1, r, dtype=np.int64)
    later = np.zeros(1, dtype=bool)
    emb_rows = [emb(x) for x in rows.tolist()]
    at = len(iters)
    for j in range(len(rows)):
        iters.append(Iteration(at + j, DECODE, rows[j:j + 1], rid, batch,
                               np.ones(1, dtype=bool) if first and j == 0 else later, emb_rows[j]))
    return len(rows)


class Future:
    """Oracle annotation of a workload (a separate pass, given only to ``oracle`` policies):
    for each (layer, expert), the ordered access keys at which the recorded routing uses it.
    The key of an access is ``(iteration * L + layer) + rank / (n + 1)``: a global order of
    (iteration, layer) steps, refined by ``rank``, the expert's first position among the ``n``
    experts of that step in access order (tokens in order, highest probability first)."""

    def __init__(self, workload: Workload) -> None:
        tr = workload.trace
        self._workload = workload
        self._experts = tr.experts
        self._iters = workload.iterations
        self.num_layers = tr.model.num_layers
        self._built: list[list[list[float]]] | None = None   # built on the first next_use

    @property
    def _uses(self) -> list[list[list[float]]]:
        if self._built is None:
            self._built = self._build()
        return self._built

    def _build(self) -> list[list[list[float]]]:
        tr = self._workload.trace
        L, E = tr.model.num_layers, tr.model.num_experts
        iters = self._iters
        experts = tr.experts
        if iters and all(it.rows0.shape[0] == 1 for it in iters) and not (experts < 0).any():
            # one token per step, its top-k experts distinct: rank j of k, the same keys as below
            rows = self._workload.token_rows()
            idx = np.array([it.index for it in iters], dtype=np.int64)
            k = experts.shape[1]
            frac = (np.arange(k, dtype=np.int64) + 1) / (k + 1)
            out: list[list[list[float]]] = []
            for layer in range(L):
                ex = experts[rows + layer].astype(np.int64).reshape(-1)
                keys = ((idx * L + layer).astype(np.float64)[:, None] + frac[None, :]).reshape(-1)
                order = np.argsort(ex, kind="stable")
                bounds = np.searchsorted(ex[order], np.arange(E + 1))
                ks = keys[order].tolist()
                out.append([ks[bounds[e]:bounds[e + 1]] for e in range(E)])
            return out
        uses: list[list[list[float]]] = [[[] for _ in range(E)] for _ in range(L)]
        for it in iters:
            for layer in range(L):
                flat = experts[it.rows0 + layer].reshape(-1)
                _, first = np.unique(flat, return_index=True)
                order = np.sort(first)
                denom = len(order) + 1
                base = it.index * L + layer
                for rank, pos in enumerate(order):
                    uses[layer][int(flat[pos])].append(base + (rank + 1) / denom)
        return uses

    def step_key(self, iteration: int, layer: int) -> float:
        """The key just after every access of step (iteration, layer)."""
        return float(iteration * self.num_layers + layer) + 0.999999

    def next_use(self, layer: int, expert: int, after: float) -> float:
        """The first access key of (layer, expert) strictly after ``after`` (inf if none)."""
        uses = self._uses[layer][expert]
        i = bisect_right(uses, after)
        return uses[i] if i < len(uses) else float("inf")

    def routing(self, iteration: int, layer: int) -> np.ndarray:
        """The recorded ``[n_tokens, top_k]`` routing of a (future) iteration and layer."""
        if not 0 <= iteration < len(self._iters):
            return np.zeros((0, self._experts.shape[1]), dtype=self._experts.dtype)
        rows: np.ndarray = self._experts[self._iters[iteration].rows0 + layer]
        return rows
