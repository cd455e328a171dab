"""Prediction recall: how well each kind of predictor that a family of policies relies on would
have guessed a trace's routing. These figures decide which policies win on a trace (moesim
issue 22), so ``simctl trace stats`` reports them and ``simctl trace fit`` can target them.

The trace's requests are split as a run's ``profile: {requests: N}`` splits them: the first
``N`` requests (in order of first appearance) are the *profile*, what a policy may study
before the run; the others are *evaluated*, on the tokens of the chosen phases (decode by
default, as a run replays). Every measure is the recall of a top-``k`` guess: ``|guess &
experts| / k`` per (token, layer), averaged; chance is ``k / E``. Per *target* layer, and
overall (pooled over the layers where the measure is defined). Guesses are ``k`` experts in
descending score, ties to the lower id.

``lookahead``
    The top-k of ``lookahead_logits`` of layer ``l`` (the next router applied to layer ``l``'s
    hidden state) against the same token's layer ``l + 1``: the speculative gate of
    Mixtral-Offloading, Pre-gated MoE and MoE-Infinity-style prefetchers. Only ``d = 1``: the
    column holds router ``l + 1`` on hidden state ``l`` and nothing of routers further ahead,
    so a trace cannot say how well router ``l + d`` would read hidden state ``l``.
``transition@d`` (d = 1, 2, 3)
    Co-routing learned on the profile: counts of (expert ``a`` at layer ``l``, expert ``b`` at
    layer ``l + d``) over the profile's tokens; a token's guess for ``l + d`` is the top-k of
    the summed count rows of its experts at ``l`` (experts of count 0 are not guessed). This
    is what the ``promoe-style`` policy uses for ``l + 2 .. l + stride``, the only predictor
    of layers beyond ``l + 1`` the trace columns support.
``previous_token``
    The experts of the previous token of the same request at the same layer (temporal
    locality; ``reuse`` of the stats table restricted to the evaluated tokens).
``same_token``
    The experts of the latest earlier token with the same ``token_id`` (any request, profile
    included) at the same layer; tokens whose id has not occurred before are left out. Needs
    the ``token_id`` column.
``popularity``
    The ``k`` experts of the layer most often routed to in the profile.
``semantic``
    fMoE's semantic matching (its Eq. 4): the profile's iterations are stored as *expert maps*
    (per layer, the iteration's mean router probabilities: softmax of ``logits``, else the
    top-k ``weights`` as a sparse vector) with the iteration's embedding; an evaluated
    iteration takes the stored map whose embedding has the highest cosine similarity with its
    own, and guesses the top-k of that map at every layer. Needs ``embedding``.
``trajectory@d`` (d = 1, 2, 3)
    fMoE's trajectory matching (its Eq. 5): for target layer ``t >= d``, the stored map whose
    layers ``0 .. t - d`` are most cosine-similar (over the concatenated probabilities) to the
    iteration's own layers ``0 .. t - d``; its layer ``t``'s top-k is the guess. fMoE
    prefetches at distance ``d = 3`` by default.

The map store and both matchings mirror ``policies/fmoe/expert_maps.py`` (cosine in float64,
the first of equal best scores, top-k of a map in descending probability with ties to the
lower id, as fMoE without its dynamic threshold, the ``Map(T+S)`` ablation); this module does
not import it (traces sit below policies). Two simplifications: the store holds every
profile iteration (fMoE's store is capped, 1000 by default, with redundancy replacement) and
does not grow during the evaluation (fMoE adds each replayed iteration), so the figures
measure matching against the profile alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import PHASES, ModelInfo, read_trace

DISTANCES = (1, 2, 3)
MEASURES = ("lookahead", *(f"transition@{d}" for d in DISTANCES), "previous_token", "same_token", "popularity",
            "semantic", *(f"trajectory@{d}" for d in DISTANCES))
"""Names of the recall measures, in report order (see the module docstring)."""

PROFILE_SHARE = 0.7
"""Default share of the requests in the profile split (fMoE's 70 % history)."""

_CHUNK_CELLS = 1 << 22  # query x store cells per block of the map matching


class RecallError(MoesimError, ValueError):
    """A recall measurement that cannot be made (e.g. a profile split leaving nothing to
    evaluate); the message is one line."""


@dataclass(frozen=True)
class Routing:
    """Per-token arrays of a trace (``N`` tokens in trace order, ``L`` layers): ``experts``
    ``[N, L, k]``, ``request`` and ``phase`` ``[N]``, ``probs`` ``[N, L, E]`` router
    probabilities (softmax of the logits, else the weights as a sparse vector, else ``1 / k``
    on the routed experts), ``lookahead`` ``[N, L, E]`` or ``None``, ``token_id`` ``[N]`` or
    ``None``, ``embedding`` ``[N, h]`` with ``has_embedding`` ``[N]`` (or ``None``)."""

    experts: np.ndarray
    request: np.ndarray
    phase: np.ndarray
    probs: np.ndarray
    lookahead: np.ndarray | None
    token_id: np.ndarray | None
    embedding: np.ndarray | None
    has_embedding: np.ndarray | None
    num_experts: int

    @property
    def top_k(self) -> int:
        """Experts per token and layer."""
        return int(self.experts.shape[2])

    @property
    def num_layers(self) -> int:
        """MoE layers."""
        return int(self.experts.shape[1])


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.asarray(x, dtype=np.float32) - np.asarray(x, dtype=np.float32).max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def routing_arrays(columns: Mapping[str, Any], model: ModelInfo) -> Routing:
    """:class:`Routing` of trace columns (``Trace.columns()``, or the columns the synthetic
    generator returns; rows ordered by request, token, layer, as the format guarantees)."""
    L, E, k = model.num_layers, model.num_experts, model.top_k
    rows = int(np.asarray(columns["request_id"]).shape[0])
    N = rows // L
    ex = np.asarray(columns["experts"], dtype=np.int64).reshape(N, L, k)
    logits, weights = columns.get("logits"), columns.get("weights")
    if logits is not None:
        probs = _softmax(np.asarray(logits).reshape(N, L, E))
    else:
        probs = np.zeros((N, L, E), dtype=np.float32)
        vals = (np.asarray(weights, dtype=np.float32).reshape(N, L, k) if weights is not None
                else np.full((N, L, k), 1.0 / k, dtype=np.float32))
        np.put_along_axis(probs, ex, vals, axis=2)
    look = columns.get("lookahead_logits")
    tok = columns.get("token_id")
    emb = has = None
    if columns.get("embedding") is not None and columns.get("embedding_rows") is not None:
        erows = np.asarray(columns["embedding_rows"], dtype=np.int64)
        on_layer0 = erows % L == 0
        src = np.asarray(columns["embedding"], dtype=np.float64)
        emb = np.zeros((N, src.shape[1]), dtype=np.float64)
        has = np.zeros(N, dtype=bool)
        emb[erows[on_layer0] // L] = src[on_layer0]
        has[erows[on_layer0] // L] = True
    return Routing(
        experts=ex, request=np.asarray(columns["request_id"])[::L].astype(np.int64),
        phase=np.asarray(columns["phase"])[::L].astype(np.int64), probs=probs,
        lookahead=None if look is None else np.asarray(look).reshape(N, L, E),
        token_id=None if tok is None else np.asarray(tok)[::L].astype(np.int64),
        embedding=emb, has_embedding=has, num_experts=E,
    )


@dataclass
class RecallStats:
    """Recall of every measure (see the module docstring): ``layers[name]`` per target layer
    (``None`` where undefined), ``overall[name]`` pooled, ``counts[name]`` the (token, layer)
    guesses behind it, ``missing[name]`` why a measure is absent."""

    profile_requests: int
    eval_requests: int
    eval_tokens: int
    store_maps: int
    phases: tuple[str, ...]
    chance: float
    layers: dict[str, list[float | None]]
    overall: dict[str, float | None]
    counts: dict[str, int]
    missing: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"profile_requests": self.profile_requests, "eval_requests": self.eval_requests,
                "eval_tokens": self.eval_tokens, "store_maps": self.store_maps, "phases": list(self.phases),
                "chance": self.chance, "overall": dict(self.overall), "layers": dict(self.layers),
                "counts": dict(self.counts), "missing": dict(self.missing)}


def default_profile_requests(requests: int) -> int:
    """The default profile split: :data:`PROFILE_SHARE` of the requests rounded down, at least
    one and leaving at least one to evaluate (0 when there is only one request)."""
    return 0 if requests < 2 else min(requests - 1, max(1, int(math.floor(PROFILE_SHARE * requests))))


def topk_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` best columns of each row of ``scores`` (``[..., E]``), highest first, equal
    scores in increasing column order."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), axis=-1, kind="stable")
    return order[..., :k]


def _hits(guess: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Common experts of each pair of ``[..., k]`` rows (``guess`` entries ``< 0`` never hit)."""
    return ((guess[..., :, None] == actual[..., None, :]) & (guess[..., :, None] >= 0)).sum(axis=(-1, -2))


class _Tally:
    """Hits and guesses per measure and target layer."""

    def __init__(self, L: int) -> None:
        self.L = L
        self.hits = {m: np.zeros(L, dtype=np.int64) for m in MEASURES}
        self.n = {m: np.zeros(L, dtype=np.int64) for m in MEASURES}

    def add(self, name: str, layer: int, guess: np.ndarray, actual: np.ndarray) -> None:
        self.hits[name][layer] += int(_hits(guess, actual).sum())
        self.n[name][layer] += int(guess.shape[0])


def recall_stats(
    routing: Routing, *, profile_requests: int | None = None, phases: Sequence[str] = ("decode",),
) -> RecallStats:
    """The recall of every measure of :data:`MEASURES` on ``routing``, the first
    ``profile_requests`` requests forming the profile (default
    :func:`default_profile_requests`), evaluated on the other requests' tokens of ``phases``."""
    L, E, k = routing.num_layers, routing.num_experts, routing.top_k
    N = routing.experts.shape[0]
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise RecallError(f"phases {list(phases)!r}: expected some of {', '.join(PHASES)}")
    order = list(dict.fromkeys(routing.request.tolist()))
    R = len(order)
    P = default_profile_requests(R) if profile_requests is None else int(profile_requests)
    if P < 0 or (P >= R and R > 0):
        raise RecallError(f"--profile-requests {P}: the trace has {R} request(s), so at most {max(R - 1, 0)} can "
                          "be profiled with one left to evaluate")
    in_prof = np.isin(routing.request, np.asarray(order[:P], dtype=np.int64))
    codes = [PHASES.index(p) for p in phases]
    ev = ~in_prof & np.isin(routing.phase, codes)
    ex = routing.experts
    tally = _Tally(L)
    missing: dict[str, str] = {}

    # iterations: a request's prefill is one, each decode token its own (as a run replays)
    new = np.ones(N, dtype=bool)
    if N > 1:
        new[1:] = ~((routing.request[1:] == routing.request[:-1]) & (routing.phase[1:] == 0)
                    & (routing.phase[:-1] == 0))
    first = np.flatnonzero(new)
    iteration = np.cumsum(new) - 1
    ev_idx = np.flatnonzero(ev)

    # lookahead (d = 1)
    if routing.lookahead is None:
        missing["lookahead"] = "the trace has no lookahead_logits"
    elif L > 1:
        for lay in range(L - 1):
            tally.add("lookahead", lay + 1, topk_desc(routing.lookahead[ev_idx, lay], k), ex[ev_idx, lay + 1])
    # previous token of the request, same token id
    prev = ev_idx[ev_idx > 0]
    prev = prev[routing.request[prev - 1] == routing.request[prev]]
    for lay in range(L):
        tally.add("previous_token", lay, ex[prev - 1, lay], ex[prev, lay])
    if routing.token_id is None:
        missing["same_token"] = "the trace has no token_id"
    else:
        srt = np.argsort(routing.token_id, kind="stable")
        last = np.full(N, -1, dtype=np.int64)
        same = routing.token_id[srt[1:]] == routing.token_id[srt[:-1]]
        last[srt[1:][same]] = srt[:-1][same]
        have = ev_idx[last[ev_idx] >= 0]
        for lay in range(L):
            tally.add("same_token", lay, ex[last[have], lay], ex[have, lay])

    prof_iters = np.unique(iteration[in_prof])
    S = int(prof_iters.size)
    if S == 0:
        for m in MEASURES:
            if m.startswith(("transition", "popularity", "semantic", "trajectory")):
                missing[m] = "no profile split (--profile-requests 0)"
    else:
        _profile_measures(routing, tally, missing, in_prof, ev_idx, first, iteration, prof_iters)

    layers: dict[str, list[float | None]] = {}
    overall: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for m in MEASURES:
        h, n = tally.hits[m], tally.n[m]
        layers[m] = [float(h[i] / (n[i] * k)) if n[i] else None for i in range(L)]
        overall[m] = float(h.sum() / (n.sum() * k)) if n.sum() else None
        counts[m] = int(n.sum())
        if overall[m] is None and m not in missing:
            d = int(m.split("@")[1]) if "@" in m else 1 if m == "lookahead" else 0
            missing[m] = (f"needs more than {d} layer(s)" if d >= L else "nothing to evaluate" if ev_idx.size
                          else "no evaluated token of the chosen phases")
    return RecallStats(
        profile_requests=P, eval_requests=R - P, eval_tokens=int(ev_idx.size), store_maps=S,
        phases=tuple(phases), chance=k / E, layers=layers, overall=overall, counts=counts, missing=missing,
    )


def _profile_measures(
    routing: Routing, tally: _Tally, missing: dict[str, str], in_prof: np.ndarray, ev_idx: np.ndarray,
    first: np.ndarray, iteration: np.ndarray, prof_iters: np.ndarray,
) -> None:
    """Popularity, transitions and fMoE's map matching, learned from the profile tokens."""
    L, E, k = routing.num_layers, routing.num_experts, routing.top_k
    ex = routing.experts
    pex = ex[in_prof]
    for lay in range(L):
        pop = np.bincount(pex[:, lay].ravel(), minlength=E)
        guess = np.broadcast_to(topk_desc(pop, k), (ev_idx.size, k))
        tally.add("popularity", lay, guess, ex[ev_idx, lay])
    for d in DISTANCES:
        for lay in range(L - d):
            table = np.zeros((E, E), dtype=np.int64)
            pairs = (pex[:, lay, :, None] * E + pex[:, lay + d, None, :]).ravel()
            table += np.bincount(pairs, minlength=E * E).reshape(E, E)
            scores = table[ex[ev_idx, lay]].sum(axis=1)  # [n, E]
            guess = topk_desc(scores, k)
            guess = np.where(np.take_along_axis(scores, guess, axis=1) > 0, guess, -1)
            tally.add(f"transition@{d}", lay + d, guess, ex[ev_idx, lay + d])

    # expert maps: the mean router probabilities of each iteration
    counts = np.diff(np.append(first, iteration.size))
    maps = np.add.reduceat(routing.probs.astype(np.float64), first, axis=0) / counts[:, None, None]  # [I, L, E]
    store = maps[prof_iters]
    store_top = topk_desc(store, k)  # [S, L, k]
    q_iters, q_of_tok = np.unique(iteration[ev_idx], return_inverse=True)
    if routing.embedding is None or routing.has_embedding is None:
        missing["semantic"] = "the trace has no embedding"
    elif not (routing.has_embedding[first[prof_iters]].all() and routing.has_embedding[first[q_iters]].all()):
        missing["semantic"] = "some iterations have no embedding"
    else:
        best = _semantic_best(routing.embedding[first[prof_iters]], routing.embedding[first[q_iters]])
        for lay in range(L):
            tally.add("semantic", lay, store_top[best[q_of_tok], lay], ex[ev_idx, lay])
    best_traj = _trajectory_best(store, maps[q_iters])  # [Q, L]: best map on layers 0..m
    for d in DISTANCES:
        for t in range(d, L):
            tally.add(f"trajectory@{d}", t, store_top[best_traj[q_of_tok, t - d], t], ex[ev_idx, t])


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of every row of ``a`` with every row of ``b`` (0 where a norm is 0)."""
    den = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=1)[None, :]
    dots = a @ b.T
    return np.divide(dots, den, out=np.zeros_like(dots), where=den > 0)


def _semantic_best(store_emb: np.ndarray, query_emb: np.ndarray) -> np.ndarray:
    """Per query, the stored entry of highest embedding cosine (the first of equals)."""
    out = np.empty(query_emb.shape[0], dtype=np.int64)
    step = max(1, _CHUNK_CELLS // max(1, store_emb.shape[0]))
    for a in range(0, query_emb.shape[0], step):
        out[a: a + step] = np.argmax(_cos_rows(query_emb[a: a + step], store_emb), axis=1)
    return out


def _trajectory_best(store: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``[Q, L]``: per query and prefix end ``m``, the stored map whose layers ``0..m`` are most
    cosine-similar to the query's (over the concatenated layers; the first of equals). The
    query's own norm scales a whole row, so the argmax divides by the stored norms only."""
    S, L, _ = store.shape
    Q = queries.shape[0]
    out = np.zeros((Q, L), dtype=np.int64)
    norm = np.sqrt(np.cumsum((store**2).sum(axis=2), axis=1))  # [S, L] prefix norms
    inv = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0).T.copy()  # [L, S]
    query_sq = np.cumsum((queries**2).sum(axis=2), axis=1)
    by_layer = np.ascontiguousarray(store.transpose(1, 2, 0))  # [L, E, S]
    step = max(1, _CHUNK_CELLS // max(1, S))
    for a in range(0, Q, step):
        qs = np.ascontiguousarray(queries[a: a + step].transpose(1, 0, 2))  # [L, q, E]
        dots = np.zeros((qs.shape[1], S))
        for m in range(L):
            dots += np.einsum("qe,es->qs", qs[m], by_layer[m])  # many small products: no BLAS threads
            best = np.argmax(dots * inv[m], axis=1)
            out[a: a + step, m] = np.where(query_sq[a: a + step, m] > 0, best, 0)
    return out


def trace_recall(
    path: str | os.PathLike[str], *, profile_requests: int | None = None, phases: Sequence[str] = ("decode",),
) -> RecallStats:
    """:func:`recall_stats` of the trace file at ``path`` (read whole, validated)."""
    tr = read_trace(path)
    return recall_stats(routing_arrays(tr.columns(), tr.model), profile_requests=profile_requests, phases=phases)
