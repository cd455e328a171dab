"""Hit-rate curves of a trace: LRU and Belady (MIN) hit rates for every cache size, per layer and
for all layers together, each policy in one pass over the trace.

The reference stream of layer ``l`` is the sequence of its expert ids in token order (requests
in trace order), each token's experts in rank order: what a sequential cache simulator sees
(libCacheSim's ``oracleGeneral`` traces are written the same way in
``benchmarks/bench_curve.py``). A cache holds ``C`` experts of one layer; "all layers" sums the
per-layer hits of caches of ``C`` experts per layer (the engine's per-layer pools).

* LRU: Mattson's stack distances (:class:`moesim.traces.analysis.stats.LruStackDistances`).
* Belady: Mattson's OPT stack (Mattson, Gecsei, Slutz and Traiger, "Evaluation techniques for
  storage hierarchies", IBM Systems Journal 9(2), 1970, section on the OPT stack): MIN is a
  stack algorithm whose priority is the time of the next reference, so the depth of each
  reference in the priority stack gives its hit or miss for every cache size at once.

A reference at depth ``d`` (0-based) hits in every cache of more than ``d`` experts; a first
reference misses everywhere. These are the sequential policies: the engine's replay differs
slightly when a token's k experts must all be resident at once (see docs/crosscheck.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from moesim.traces.analysis.stats import LruStackDistances


def next_use(stream: np.ndarray) -> np.ndarray:
    """For every reference of ``stream``, the index of the next reference to the same item, or
    ``len(stream)`` when there is none."""
    s = np.asarray(stream, dtype=np.int64)
    n = s.size
    out = np.full(n, n, dtype=np.int64)
    if n:
        order = np.lexsort((np.arange(n), s))        # by item, then time
        same = s[order][1:] == s[order][:-1]
        out[order[:-1][same]] = order[1:][same]
    return out


def opt_depths(stream: np.ndarray, num_items: int) -> np.ndarray:
    """Depth of every reference in Mattson's OPT (Belady) stack, ``-1`` for a first reference:
    the reference hits in a MIN cache of ``C`` items exactly when ``0 <= depth < C``.

    The stack keeps items ordered so that its top ``C`` are MIN's cache of size ``C``. On a
    reference to ``x`` at depth ``d``, ``x`` moves to the top and the items above its old place
    move down through a carry: at each position the item referenced sooner stays, the other is
    carried on, and the last carry fills ``x``'s old place (or a new bottom place on a miss).
    Items never referenced again get distinct priorities beyond the stream's end (their order
    cannot change any hit). O(sum of depths) work."""
    s = np.asarray(stream, dtype=np.int64)
    n = s.size
    nxt = next_use(s).tolist()
    # priority: time of the next reference (smaller = sooner = kept); never again: n + item
    prio = [n + i for i in range(num_items)]
    stack: list[int] = []
    depths = np.empty(n, dtype=np.int64)
    index = stack.index
    for i, x in enumerate(s.tolist()):
        try:
            d = index(x)
        except ValueError:
            d = -1
        depths[i] = d
        if d != 0 and stack:
            carry = stack[0]
            stack[0] = x
            pc = prio[carry]
            end = d if d > 0 else len(stack)
            for j in range(1, end):
                y = stack[j]
                py = prio[y]
                if py > pc:        # y is referenced later than the carry: the carry stays here
                    stack[j] = carry
                    carry, pc = y, py
            if d > 0:
                stack[d] = carry
            else:
                stack.append(carry)
        elif not stack:
            stack.append(x)
        u = nxt[i]
        prio[x] = u if u < n else n + x
    return depths


def hits_by_size(depths: np.ndarray, max_size: int) -> np.ndarray:
    """``hits[C]`` for ``C = 0 .. max_size``: references of depth ``< C`` (depths of hits are
    below the number of items, ``max_size``)."""
    d = depths[depths >= 0]
    hist = np.bincount(d, minlength=max_size)[:max_size]
    return np.concatenate([[0], np.cumsum(hist)]).astype(np.int64)


@dataclass
class Curves:
    """Hit counts of LRU and Belady for every cache size ``0 .. num_experts`` (experts per
    layer), per layer: ``lru[l, C]``, ``belady[l, C]``, with ``references[l]`` per layer."""

    lru: np.ndarray
    belady: np.ndarray
    references: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        """Cache sizes (experts per layer) of the columns."""
        return np.arange(self.lru.shape[1])

    def columns(self) -> dict[str, np.ndarray]:
        """The tidy table: one row per (policy, layer, size); layer ``-1`` is all layers
        together (caches of ``size`` experts in every layer)."""
        L, S = self.lru.shape
        pol, lay, size, hits, refs = [], [], [], [], []
        for name, mat in (("lru", self.lru), ("belady", self.belady)):
            for layer in [*range(L), -1]:
                h = mat.sum(axis=0) if layer < 0 else mat[layer]
                r = int(self.references.sum()) if layer < 0 else int(self.references[layer])
                pol += [name] * S
                lay += [layer] * S
                size += list(range(S))
                hits += h.tolist()
                refs += [r] * S
        h_arr, r_arr = np.asarray(hits, dtype=np.int64), np.asarray(refs, dtype=np.int64)
        rate = np.divide(h_arr, r_arr, out=np.full(h_arr.size, np.nan), where=r_arr > 0)
        return {"policy": np.asarray(pol), "layer": np.asarray(lay, dtype=np.int32),
                "size": np.asarray(size, dtype=np.int32), "hits": h_arr, "references": r_arr,
                "hit_rate": rate}


def curves(layer_streams: Iterable[np.ndarray], num_experts: int) -> Curves:
    """LRU and Belady hit counts of every size for each layer's stream (item ids ``0 ..
    num_experts-1``)."""
    lru_rows, opt_rows, refs = [], [], []
    for s in layer_streams:
        s = np.asarray(s, dtype=np.int64).reshape(-1)
        acc = LruStackDistances(num_experts)
        acc.update(s)
        lru_rows.append(np.concatenate([[0], np.cumsum(acc.histogram)]))
        opt_rows.append(hits_by_size(opt_depths(s, num_experts), num_experts))
        refs.append(s.size)
    return Curves(np.asarray(lru_rows, dtype=np.int64).reshape(len(refs), num_experts + 1),
                  np.asarray(opt_rows, dtype=np.int64).reshape(len(refs), num_experts + 1),
                  np.asarray(refs, dtype=np.int64))
