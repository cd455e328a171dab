"""Routing statistics of a moe-trace file, computed in one streaming pass.

Per MoE layer:

``entropy``
    Shannon entropy of the expert popularity (share of all selections each expert gets),
    divided by ``log(E)``: 1 is perfectly balanced, 0 is one expert only.
``top10_share``
    Share of all selections that go to the ``ceil(E / 10)`` most popular experts.
``reuse``
    Token-to-token expert reuse: ``|experts(t) & experts(t-1)| / k`` for every token ``t``
    that has a previous token in the same request, averaged. Chance level is ``k / E``.
``next_layer_acc``
    Next-layer prediction accuracy from ``lookahead_logits``: ``|topk(lookahead[l]) &
    experts[l+1]| / k`` for the same token; at the last layer, against layer 0 of the next
    token of the same request. ``None`` when the trace has no lookahead logits.
``coact_sparsity``
    Pairwise co-activation sparsity: ``1 - m / P`` where ``P = E (E - 1) / 2`` expert pairs
    and ``m`` the fewest pairs that together hold 90% of all co-activations (two experts
    selected for the same token). About 0.1 for independent uniform routing, towards 1 when
    a few pairs dominate. ``coact_zero`` is the share of pairs never co-activated (depends on
    the trace length). ``None`` for top-1 models.
``lru``
    LRU hit rate per cache size (experts of that layer held), under the definition a run's
    ``hit_rate`` uses (docs/contract.md, "Hit rate"): the layer's tokens in trace order
    (requests one after the other, from an empty cache), each token's ``k`` experts looked
    up together (an expert is a hit when it is among the ``C`` most recently used before the
    token: a token never evicts its own experts, as a run pins them), then all made most
    recent. It equals ``simctl run`` with ``policy: lru``, ``cache.experts_per_layer: C``,
    batch 1 and every request replayed (``tests/test_trace_stats.py`` checks it). All sizes
    come from one pass of Mattson's LRU stack distances, :func:`lru_hit_rates`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from moesim.traces.format.trace_file import (
    DEFAULT_BATCH_ROWS,
    PHASES,
    TraceError,
    TraceMeta,
    iter_batches,
    read_meta,
)

# --------------------------------------------------------------------------------------------
# LRU stack distances (Mattson et al., 1970)


class LruStackDistances:
    """Mattson's LRU stack distances of a stream of item ids ``0..num_items-1``, fed in
    chunks. The distance of a reference is the number of distinct other items referenced
    since the previous reference to the same item (``-1`` for a first reference); it hits in
    an LRU cache of ``C`` items exactly when ``0 <= distance < C``, so one pass gives the hit
    rate of every cache size.

    Vectorised with the last-reference time of every item: O(n * num_items) work, memory
    bounded by ``chunk`` references at a time. Meant for expert streams (a few hundred items
    at most).
    """

    def __init__(self, num_items: int, *, chunk_cells: int = 1 << 21) -> None:
        if num_items < 1:
            raise ValueError("num_items must be >= 1")
        self.num_items = int(num_items)
        self._last = np.full(self.num_items, -1, dtype=np.int64)  # last reference time per item
        self._t = 0
        self._chunk = max(256, chunk_cells // self.num_items)
        self.histogram = np.zeros(self.num_items, dtype=np.int64)  # references per distance
        self.references = 0

    def update(self, stream: Iterable[int] | np.ndarray, *, group: int = 1) -> np.ndarray:
        """Feed the next references; returns their stack distances (``-1``: first reference)
        and adds them to :attr:`histogram`.

        ``group`` consecutive references are looked up together (one token's ``k`` experts, as
        a run does: the layer's planned experts are pinned before any is loaded): each one's
        distance counts the distinct items referenced since its last use *before the group*,
        so an expert of the token is never pushed out by another expert of the same token.
        Afterwards all become most recent, the last listed most recent of all."""
        s = np.asarray(stream, dtype=np.int64).reshape(-1)
        if s.size and (s.min() < 0 or s.max() >= self.num_items):
            raise ValueError(f"item ids must be in 0..{self.num_items - 1}")
        if group < 1 or s.size % group:
            raise ValueError(f"the stream of {s.size} references is not made of groups of {group}")
        chunk = max(group, self._chunk // group * group)
        out = np.empty(s.size, dtype=np.int64)
        for a in range(0, s.size, chunk):
            out[a: a + chunk] = self._update(s[a: a + chunk], group)
        hits = out[out >= 0]
        self.histogram += np.bincount(hits, minlength=self.num_items)[: self.num_items]
        self.references += int(s.size)
        return out

    def _update(self, s: np.ndarray, group: int = 1) -> np.ndarray:
        n = s.size
        rows = np.arange(n)
        times = self._t + rows
        # last[i, e]: last reference time of item e up to and including reference i
        last = np.full((n, self.num_items), -1, dtype=np.int64)
        last[rows, s] = times
        np.maximum.accumulate(last, axis=0, out=last)
        np.maximum(last, self._last[None, :], out=last)
        before = np.empty_like(last)  # strictly before the group of reference i
        start = rows - rows % group
        first = start == 0
        before[first] = self._last
        before[~first] = last[start[~first] - 1]
        prev = before[rows, s]
        dist = (before > prev[:, None]).sum(axis=1)
        dist[prev < 0] = -1
        self._last = last[-1].copy()
        self._t += n
        return dist

    def hit_rates(self, sizes: Sequence[int]) -> np.ndarray:
        """Hit rate (hits / all references, first references count as misses) of an LRU
        cache of each size in ``sizes`` (items); ``nan`` before any reference."""
        cum = np.concatenate([[0], np.cumsum(self.histogram)])
        out = np.empty(len(sizes), dtype=np.float64)
        for i, c in enumerate(sizes):
            if c < 0:
                raise ValueError("cache sizes must be >= 0")
            out[i] = cum[min(int(c), self.num_items)] / self.references if self.references else math.nan
        return out


def lru_stack_distances(stream: Sequence[int] | np.ndarray, num_items: int | None = None) -> np.ndarray:
    """LRU stack distance of every reference of ``stream`` (``-1`` for a first reference)."""
    s = np.asarray(stream, dtype=np.int64).reshape(-1)
    n_items = int(num_items if num_items is not None else (s.max() + 1 if s.size else 1))
    return LruStackDistances(n_items).update(s)


def lru_hit_rates(
    experts_per_layer_stream: Sequence[int] | np.ndarray, sizes: Sequence[int], *, num_items: int | None = None,
) -> np.ndarray:
    """Hit rates of LRU caches of ``sizes`` items on one stream of item ids (``0 ..
    num_items-1``, default: up to the largest id), all sizes in one pass (Mattson's stack
    distances). A 2-D ``[tokens, k]`` array is one token per row, its experts looked up
    together as a run does (see :meth:`LruStackDistances.update`, ``group``); a 1-D stream is
    one reference after another. First references are misses. Returns a float array aligned
    with ``sizes``."""
    arr = np.asarray(experts_per_layer_stream, dtype=np.int64)
    group = int(arr.shape[1]) if arr.ndim == 2 and arr.shape[1] > 0 else 1
    s = arr.reshape(-1)
    acc = LruStackDistances(int(num_items) if num_items is not None else (int(s.max()) + 1 if s.size else 1))
    acc.update(s, group=group)
    return acc.hit_rates(sizes)


# --------------------------------------------------------------------------------------------
# Trace statistics


def default_cache_sizes(num_experts: int, top_k: int) -> list[int]:
    """Cache sizes (experts per layer) reported by default: top_k and 1/4, 1/2, 3/4 of E."""
    sizes = {top_k} | {max(1, round(num_experts * f)) for f in (0.25, 0.5, 0.75)}
    return sorted(s for s in sizes if 1 <= s <= num_experts)


@dataclass
class LayerStats:
    """Statistics of one MoE layer (see the module docstring for the definitions)."""

    layer: int
    entropy: float
    top10_share: float
    reuse: float | None
    next_layer_acc: float | None
    coact_sparsity: float | None
    coact_zero: float | None
    lru: dict[int, float]


@dataclass
class TraceStats:
    """Statistics of a whole trace: per layer, and ``overall`` (pooled over layers; entropy,
    top-10% share and co-activation sparsity are the mean over layers)."""

    path: str
    meta: TraceMeta
    rows: int
    tokens: int
    requests: int
    tokens_by_phase: dict[str, int]
    cache_sizes: list[int]
    chance_reuse: float
    layers: list[LayerStats]
    overall: LayerStats

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``nan`` becomes ``None``)."""

        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {str(k): clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        m = self.meta.model
        return clean({
            "file": self.path,
            "model": {"name": m.name, "num_layers": m.num_layers, "num_experts": m.num_experts,
                      "top_k": m.top_k, "num_shared_experts": m.num_shared_experts},
            "rows": self.rows, "tokens": self.tokens, "requests": self.requests,
            "tokens_by_phase": self.tokens_by_phase, "cache_sizes": self.cache_sizes,
            "chance_reuse": self.chance_reuse,
            "layers": [asdict(s) for s in self.layers],
            "overall": asdict(self.overall),
        })


@dataclass
class _Accumulator:
    """Running sums over complete tokens, fed in token-aligned chunks."""

    L: int
    E: int
    k: int
    counts: np.ndarray = field(init=False)
    pairs: np.ndarray = field(init=False)
    reuse_sum: np.ndarray = field(init=False)
    reuse_n: int = 0
    acc_sum: np.ndarray = field(init=False)
    acc_n: np.ndarray = field(init=False)
    lru: list[LruStackDistances] = field(init=False)
    prev_req: int = -1
    prev_ex: np.ndarray | None = None
    prev_look_last: np.ndarray | None = None
    tokens: int = 0
    requests: int = 0
    phase_tokens: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.counts = np.zeros((self.L, self.E), dtype=np.int64)
        self.pairs = np.zeros((self.L, self.E * self.E), dtype=np.int64)
        self.reuse_sum = np.zeros(self.L, dtype=np.int64)
        self.acc_sum = np.zeros(self.L, dtype=np.int64)
        self.acc_n = np.zeros(self.L, dtype=np.int64)
        self.lru = [LruStackDistances(self.E) for _ in range(self.L)]
        self.phase_tokens = np.zeros(len(PHASES), dtype=np.int64)

    @staticmethod
    def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Common entries of each pair of rows of ``a`` and ``b`` (``[..., k]``, no repeats)."""
        return (a[..., :, None] == b[..., None, :]).sum(axis=(-1, -2))

    def add(self, req: np.ndarray, phase: np.ndarray, ex: np.ndarray, look_top: np.ndarray | None) -> None:
        """``req``/``phase`` ``[T]``, ``ex`` ``[T, L, k]``, ``look_top`` ``[T, L, k]`` or None."""
        T, L, E = ex.shape[0], self.L, self.E
        if T == 0:
            return
        self.tokens += T
        self.phase_tokens += np.bincount(phase, minlength=len(PHASES))[: len(PHASES)]
        prev_req = np.concatenate([[self.prev_req], req[:-1]])
        self.requests += int((req != prev_req).sum())
        cont = req == prev_req  # token has a previous token in the same request
        ex64 = ex.astype(np.int64)
        layer_base = (np.arange(L, dtype=np.int64) * E)[None, :, None]
        self.counts += np.bincount((ex64 + layer_base).ravel(), minlength=L * E).reshape(L, E)
        if self.k > 1:
            i, j = np.triu_indices(self.k, 1)
            a, b = ex64[:, :, i], ex64[:, :, j]
            code = np.minimum(a, b) * E + np.maximum(a, b) + (np.arange(L, dtype=np.int64) * E * E)[None, :, None]
            self.pairs += np.bincount(code.ravel(), minlength=L * E * E).reshape(L, E * E)
        prev_ex = np.concatenate([self.prev_ex[None] if self.prev_ex is not None else ex[:1], ex[:-1]])
        ov = self._overlap(ex[cont], prev_ex[cont])  # [n, L]
        self.reuse_sum += ov.sum(axis=0)
        self.reuse_n += int(cont.sum())
        if look_top is not None:
            if L > 1:
                self.acc_sum[:-1] += self._overlap(look_top[:, :-1], ex[:, 1:]).sum(axis=0)
                self.acc_n[:-1] += T
            prev_look = np.concatenate([self.prev_look_last[None] if self.prev_look_last is not None
                                        else look_top[:1, -1], look_top[:-1, -1]])
            self.acc_sum[-1] += int(self._overlap(prev_look[cont], ex[cont, 0]).sum())
            self.acc_n[-1] += int(cont.sum())
            self.prev_look_last = look_top[-1, -1].copy()
        for lay in range(L):
            self.lru[lay].update(ex64[:, lay, :].reshape(-1), group=self.k)
        self.prev_req = int(req[-1])
        self.prev_ex = ex[-1].copy()

    def result(self, sizes: list[int]) -> tuple[list[LayerStats], LayerStats]:
        L, E, k = self.L, self.E, self.k
        layers: list[LayerStats] = []
        n_top = max(1, math.ceil(E / 10))
        iu = np.triu_indices(E, 1)
        for lay in range(L):
            c = self.counts[lay].astype(np.float64)
            tot = c.sum()
            p = c[c > 0] / tot if tot else np.zeros(0)
            ent = float(-(p * np.log(p)).sum() / math.log(E)) if E > 1 and tot else (1.0 if tot else math.nan)
            top = float(np.sort(c)[::-1][:n_top].sum() / tot) if tot else math.nan
            sparsity = zero = None
            if k > 1:
                pc = self.pairs[lay].reshape(E, E)[iu].astype(np.float64)
                ptot = pc.sum()
                if ptot > 0:
                    cum = np.cumsum(np.sort(pc)[::-1])
                    m = int(np.searchsorted(cum, 0.9 * ptot - 1e-9 * ptot)) + 1
                    sparsity = 1.0 - m / pc.size
                    zero = float((pc == 0).mean())
            reuse = float(self.reuse_sum[lay] / (self.reuse_n * k)) if self.reuse_n else None
            acc = float(self.acc_sum[lay] / (self.acc_n[lay] * k)) if self.acc_n[lay] else None
            rates = self.lru[lay].hit_rates(sizes)
            layers.append(LayerStats(lay, ent, top, reuse, acc, sparsity, zero,
                                     {s: float(r) for s, r in zip(sizes, rates, strict=True)}))

        def mean(vals: list[float | None]) -> float | None:
            v = [x for x in vals if x is not None and math.isfinite(x)]
            return float(np.mean(v)) if v else None

        def mean_or_nan(vals: list[float | None]) -> float:
            v = mean(vals)
            return math.nan if v is None else v

        refs = sum(x.references for x in self.lru)
        pooled_lru = {}
        for s in sizes:
            hits = sum(int(x.histogram[: min(s, E)].sum()) for x in self.lru)
            pooled_lru[s] = hits / refs if refs else math.nan
        acc_n = int(self.acc_n.sum())
        overall = LayerStats(
            layer=-1,
            entropy=mean_or_nan([x.entropy for x in layers]),
            top10_share=mean_or_nan([x.top10_share for x in layers]),
            reuse=float(self.reuse_sum.sum() / (self.reuse_n * k * L)) if self.reuse_n else None,
            next_layer_acc=float(self.acc_sum.sum() / (acc_n * k)) if acc_n else None,
            coact_sparsity=mean([x.coact_sparsity for x in layers]),
            coact_zero=mean([x.coact_zero for x in layers]),
            lru=pooled_lru,
        )
        return layers, overall


def _topk_sets(mat: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` largest entries of each row (in no particular order)."""
    if k >= mat.shape[1]:
        return np.broadcast_to(np.arange(mat.shape[1]), (mat.shape[0], mat.shape[1])).copy()
    return np.argpartition(-mat.astype(np.float32), k - 1, axis=1)[:, :k]


def trace_stats(
    path: str | os.PathLike[str], *, cache_sizes: Sequence[int] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> TraceStats:
    """Compute :class:`TraceStats` of a trace file in one streaming pass (validating it).

    ``cache_sizes`` (experts per layer) defaults to :func:`default_cache_sizes`. Memory
    stays in proportion to ``batch_rows`` plus ``L * E^2`` counters.
    """
    meta = read_meta(path)
    m = meta.model
    L, E, k = m.num_layers, m.num_experts, m.top_k
    sizes = sorted(set(int(s) for s in cache_sizes)) if cache_sizes else default_cache_sizes(E, k)
    for s in sizes:
        if s < 1:
            raise ValueError(f"cache sizes must be >= 1, got {s}")
    acc = _Accumulator(L, E, k)
    rows = 0
    carry: dict[str, np.ndarray] | None = None
    for batch in iter_batches(path, ["lookahead_logits"], batch_rows=batch_rows):
        rows += int(batch["request_id"].shape[0])
        if carry is not None and set(carry) != set(batch):
            raise TraceError(path, "column is filled in some row groups and null in others",
                             row=rows - int(batch["request_id"].shape[0]), column="lookahead_logits")
        if carry is not None:
            batch = {key: np.concatenate([carry[key], batch[key]]) for key in batch}
        n = batch["request_id"].shape[0]
        full = (n // L) * L  # rows are validated: every token has L rows, layer 0 first
        carry = {key: v[full:] for key, v in batch.items()}
        if full == 0:
            continue
        T = full // L
        ex = batch["experts"][:full].reshape(T, L, k)
        look = batch.get("lookahead_logits")
        look_top = _topk_sets(look[:full], k).reshape(T, L, k) if look is not None else None
        acc.add(batch["request_id"][:full:L], batch["phase"][:full:L].astype(np.int64), ex, look_top)
    layers, overall = acc.result(sizes)
    return TraceStats(
        path=str(path), meta=meta, rows=rows, tokens=acc.tokens, requests=acc.requests,
        tokens_by_phase={name: int(acc.phase_tokens[i]) for i, name in enumerate(PHASES)},
        cache_sizes=sizes, chance_reuse=k / E, layers=layers, overall=overall,
    )


# --------------------------------------------------------------------------------------------
# Inspection


def trace_summary(path: str | os.PathLike[str], *, head: int = 5) -> dict[str, Any]:
    """Metadata, counts and the first ``head`` rows of a trace, validating the whole file in
    one streaming pass. JSON-ready."""
    import pyarrow.parquet as pq

    meta = read_meta(path)
    pf = pq.ParquetFile(path)
    L = meta.model.num_layers
    rows = 0
    rows_by_phase = np.zeros(len(PHASES), dtype=np.int64)
    tok_req: list[np.ndarray] = []
    emb_rows = 0
    emb_dim: int | None = None
    first: dict[str, np.ndarray] | None = None
    for batch in iter_batches(path):
        n = int(batch["request_id"].shape[0])
        if first is None:
            first = {k: v[:head] for k, v in batch.items() if k not in ("embedding", "embedding_rows")}
        rows_by_phase += np.bincount(batch["phase"].astype(np.int64), minlength=len(PHASES))[: len(PHASES)]
        tok_req.append(batch["request_id"][batch["layer"] == 0])
        if "embedding" in batch:
            emb_rows += int(batch["embedding"].shape[0])
            emb_dim = int(batch["embedding"].shape[1])
        rows += n
    req = np.concatenate(tok_req) if tok_req else np.zeros(0, dtype=np.int64)
    if req.size:
        change = np.flatnonzero(np.diff(req)) + 1
        per_req = np.diff(np.concatenate([[0], change, [req.size]]))
    else:
        per_req = np.zeros(0, dtype=np.int64)
    head_rows: list[dict[str, Any]] = []
    if first is not None:
        for i in range(min(head, int(first["request_id"].shape[0]))):
            row: dict[str, Any] = {
                "request_id": int(first["request_id"][i]), "token_idx": int(first["token_idx"][i]),
                "phase": PHASES[int(first["phase"][i])], "layer": int(first["layer"][i]),
                "experts": [int(x) for x in first["experts"][i]],
            }
            if "weights" in first:
                row["weights"] = [round(float(x), 5) for x in first["weights"][i]]
            if "token_id" in first:
                row["token_id"] = int(first["token_id"][i])
            head_rows.append(row)
    m = meta.model
    return {
        "file": str(path),
        "bytes": os.path.getsize(path),
        "row_groups": pf.metadata.num_row_groups,
        "version": meta.version,
        "model": {"name": m.name, "num_layers": m.num_layers, "num_experts": m.num_experts,
                  "top_k": m.top_k, "num_shared_experts": m.num_shared_experts},
        "source": meta.source,
        "columns": list(pf.schema_arrow.names),
        "rows": rows,
        "tokens": int(req.size),
        "requests": int(per_req.size),
        "rows_by_phase": {name: int(rows_by_phase[i]) for i, name in enumerate(PHASES)},
        "tokens_by_phase": {name: int(rows_by_phase[i]) // L for i, name in enumerate(PHASES)},
        "tokens_per_request": ({"min": int(per_req.min()), "mean": float(per_req.mean()), "max": int(per_req.max())}
                               if per_req.size else None),
        "embedding": {"rows": emb_rows, "dim": emb_dim} if emb_dim is not None else None,
        "head": head_rows,
    }
