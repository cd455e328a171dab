"""Cross-check of moesim's demand caches against libCacheSim (the ``libcachesim`` package).

Run: ``python benchmarks/crosscheck_libcachesim.py`` (prints the tables of ``docs/crosscheck.md``).

Both simulators replay the FLAME-MoE-290M sample (``traces/samples/flame-moe-290m.parquet``):
batch 1, decode phase, every request, with one cache of ``C`` experts per MoE layer. The
request stream of layer ``l`` is the sequence of expert ids in token order (requests in trace
order), each token's top-k in rank order (highest router probability first). In libCacheSim
every expert is an object of size 1 (id = expert + 1) in a cache of ``C`` bytes, one cache per
layer.

Two ways of feeding that stream to libCacheSim:

``sequential``
    every request through ``cache.get`` in stream order: the textbook trace-driven simulation.
``step``
    one layer step (a token's k experts) at a time, as the engine sees it: (1) look all k up
    without side effects, which decides hit or miss for each; (2) make room for the misses
    with libCacheSim's own victim order, except that the step's experts are pinned (the engine
    never evicts one of them): a pinned expert libCacheSim picks is taken out of the cache and
    held aside; (3) in rank order, serve the hits (``find`` with update), put the held ones
    back with their metadata restored, and insert the misses. Restoring uses only what the
    request carries or libCacheSim's own state: LRU and Belady re-insert (recency, next
    access), LFU re-inserts and replays the expert's in-cache count as lookups, FIFO puts the
    held experts back at the head of the queue by draining and refilling it in its own order.
    (Belady never picks a pinned expert: a hit's stored next access is the current step.)

With top-1 routing the two coincide (a step has one expert, nothing to pin). Belady's next
access is the position, in the layer's stream, of the expert's next request
(``next_access_vtime``, ``INT64_MAX`` if none), what libCacheSim's ``oracleGeneral`` reader
would supply.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from moesim.sim.config.scenario import load_scenario_data  # noqa: E402
from moesim.sim.engine.workload import build_workload  # noqa: E402
from moesim.sim.run.runner import run_loaded  # noqa: E402
from moesim.traces.format.trace_file import (  # noqa: E402
    ModelInfo,
    Trace,
    TraceMeta,
    read_trace,
    trace_from_columns,
)

SAMPLE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
POLICIES = ("lru", "lfu", "fifo", "belady")
TOP1_SIZES = (2, 4, 8, 16, 32)
TOPK_SIZES = (6, 8, 16, 32)
NEVER = np.iinfo(np.int64).max  # libCacheSim's "no next access"


# --------------------------------------------------------------------------------------------
# traces


@cache
def load_sample() -> Trace:
    """The FLAME sample as recorded (8 MoE layers, 64 experts, top-6)."""
    return read_trace(SAMPLE)


@cache
def top1_sample() -> Trace:
    """The FLAME sample with each token keeping only its first (highest-ranked) expert."""
    return top1_projection(load_sample())


def top1_projection(trace: Trace) -> Trace:
    """``trace`` with each row's experts (and weights) cut to the first, and the model's top_k 1."""
    cols: dict[str, Any] = {k: v for k, v in trace.columns().items()
                            if k not in ("logits", "lookahead_logits", "embedding", "embedding_rows")}
    cols["experts"] = np.ascontiguousarray(trace.experts[:, :1])
    if trace.weights is not None:
        cols["weights"] = np.ascontiguousarray(trace.weights[:, :1])
    m = trace.model
    meta = TraceMeta(model=ModelInfo(m.name, m.num_layers, m.num_experts, 1, m.num_shared_experts),
                     source=dict(trace.meta.source, projection="top-1 (first expert of each token)"))
    return trace_from_columns(cols, meta)


def layer_streams(trace: Trace) -> list[np.ndarray]:
    """Per MoE layer, the ``[steps, top_k]`` expert ids in the order the engine replays them
    (batch 1, decode, every request)."""
    wl = build_workload(trace, batch_size=1, phases=["decode"], requests="all")
    rows0 = np.concatenate([it.rows0 for it in wl.iterations])
    return [trace.experts[rows0 + layer].astype(np.int64) for layer in range(trace.model.num_layers)]


# --------------------------------------------------------------------------------------------
# the two simulators


@dataclass
class Hits:
    """Hit counts of one run: in total, per layer, and per layer step (``steps[l][t]``)."""

    hits: int
    accesses: int
    steps: list[np.ndarray]
    pinned: list[np.ndarray] | None = None   # libCacheSim only, per layer step: victims that
    #   were experts of the step itself, which the engine pins and so never evicts

    @property
    def pinned_victims(self) -> int:
        return 0 if self.pinned is None else int(sum(int(p.sum()) for p in self.pinned))

    @property
    def rate(self) -> float:
        return self.hits / self.accesses

    @property
    def per_layer(self) -> list[int]:
        return [int(s.sum()) for s in self.steps]


def engine_hits(trace: Trace, policy: str, experts_per_layer: int) -> Hits:
    """moesim's engine on ``trace`` with ``experts_per_layer`` experts per layer, cold start."""
    m = trace.model
    data = {
        "name": f"crosscheck-{policy}-{experts_per_layer}",
        "trace": str(SAMPLE),  # not read: the trace is passed in below
        "model": {"base": m.name, "top_k": m.top_k},
        "hardware": "rtx-4090",
        "cache": {"experts_per_layer": experts_per_layer, "initial": "empty"},
        "policy": policy,
        "workload": {"batch_size": 1, "phases": ["decode"], "requests": "all"},
    }
    result = run_loaded(load_scenario_data(data, source="crosscheck", base_dir=ROOT), trace=trace)
    cols = result.steps
    n_iter = int(cols["iteration"].max()) + 1
    steps = [np.zeros(n_iter, dtype=np.int64) for _ in range(m.num_layers)]
    steps_it, steps_layer, steps_hits = cols["iteration"], cols["layer"], cols["hits"]
    for it, layer, hits in zip(steps_it.tolist(), steps_layer.tolist(), steps_hits.tolist(), strict=True):
        steps[layer][it] = hits
    return Hits(int(result.metrics["hits"]), int(result.metrics["accesses"]), steps)


def _next_access(stream: np.ndarray) -> np.ndarray:
    """For each request of a flat stream, the index of the next request of the same object."""
    nxt = np.full(stream.shape[0], NEVER, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(stream.shape[0] - 1, -1, -1):
        e = int(stream[i])
        nxt[i] = last.get(e, NEVER)
        last[e] = i
    return nxt


def _new_cache(policy: str, size: int) -> Any:
    import libcachesim as lcs

    cls = {"lru": lcs.LRU, "lfu": lcs.LFU, "fifo": lcs.FIFO, "belady": lcs.Belady}[policy]
    return cls(size, hashpower=10)


def peer_hits(trace: Trace, policy: str, experts_per_layer: int, protocol: str = "sequential") -> Hits:
    """libCacheSim's ``policy`` on ``trace`` (see the module docstring for ``protocol``)."""
    if protocol not in ("sequential", "step"):
        raise ValueError(f"protocol must be 'sequential' or 'step', got {protocol!r}")
    run = _replay_sequential if protocol == "sequential" else _replay_step
    steps, pinned, total = [], [], 0
    for reqs in _layer_requests(trace):
        h, p = run(policy, experts_per_layer, reqs)
        steps.append(h)
        pinned.append(p)
        total += sum(len(r) for r in reqs)
    return Hits(int(sum(int(s.sum()) for s in steps)), total, steps, pinned)


_REQUESTS: dict[int, tuple[Trace, list[list[list[Any]]]]] = {}


def _layer_requests(trace: Trace) -> list[list[list[Any]]]:
    """Per layer and step, the libCacheSim requests of the step's experts in rank order (built
    once per trace: libCacheSim only reads them)."""
    got = _REQUESTS.get(id(trace))
    if got is not None and got[0] is trace:
        return got[1]
    import libcachesim as lcs

    read = lcs.ReqOp.OP_READ
    out = []
    for mat in layer_streams(trace):
        n, k = mat.shape
        nxt = _next_access(mat.reshape(-1))
        out.append([[lcs.Request(obj_size=1, op=read, obj_id=int(mat[t, r]) + 1, clock_time=t,
                                 next_access_vtime=int(nxt[t * k + r])) for r in range(k)]
                    for t in range(n)])
    _REQUESTS[id(trace)] = (trace, out)
    return out


def _replay_sequential(policy: str, size: int, layer_reqs: list[list[Any]]) -> tuple[np.ndarray, np.ndarray]:
    c = _new_cache(policy, size)
    hits = np.zeros(len(layer_reqs), dtype=np.int64)
    pinned = np.zeros(len(layer_reqs), dtype=np.int64)
    for t, reqs in enumerate(layer_reqs):
        step = {q.obj_id for q in reqs}
        for q in reqs:
            if len(reqs) > 1 and c.find(q, update_cache=False) is None and c.need_eviction(q) \
                    and c.to_evict(q).obj_id in step:
                pinned[t] += 1   # the peer evicts an expert of this very token
            hits[t] += c.get(q)
    return hits, pinned


def _replay_step(policy: str, size: int, layer_reqs: list[list[Any]]) -> tuple[np.ndarray, np.ndarray]:
    c = _new_cache(policy, size)
    hits = np.zeros(len(layer_reqs), dtype=np.int64)
    pinned = np.zeros(len(layer_reqs), dtype=np.int64)
    count: dict[int, int] = {}   # LFU: mirror of libCacheSim's in-cache frequency (1 on insert)
    for t, reqs in enumerate(layer_reqs):
        ids = [q.obj_id for q in reqs]
        step = set(ids)
        present = [c.find(q, update_cache=False) is not None for q in reqs]
        hits[t] = sum(present)
        misses = len(reqs) - hits[t]
        held: list[int] = []   # pinned experts libCacheSim chose as victims, in its victim order
        while c.get_n_obj() + len(held) + misses > size:
            victim = c.to_evict(reqs[0]).obj_id
            if victim in step:
                held.append(victim)
                c.remove(victim)
            else:
                c.evict(reqs[0])
                count.pop(victim, None)
        pinned[t] = len(held)
        if policy == "fifo" and held:
            # back to the head of the queue: drain the rest in libCacheSim's order, refill
            rest = []
            while c.get_n_obj():
                v = c.to_evict(reqs[0]).obj_id
                rest.append(v)
                c.remove(v)
            by_id = {q.obj_id: q for q in reqs}
            for v in held + rest:
                c.insert(by_id[v] if v in by_id else _plain_request(v))
            held = []
        for q, hit in zip(reqs, present, strict=True):
            oid = q.obj_id
            if hit and oid not in held:
                c.find(q, update_cache=True)       # LRU: most recent; LFU: +1; Belady: next access
                count[oid] = count.get(oid, 1) + 1
            elif hit:
                c.insert(q)                        # LRU: most recent; Belady: next access
                if policy == "lfu":
                    for _ in range(count[oid]):    # replay the count: ends at count + 1, at the
                        c.find(q, update_cache=True)   # tail of its frequency list, as a hit would
                count[oid] = count.get(oid, 1) + 1
            else:
                c.insert(q)
                count[oid] = 1
        assert c.get_n_obj() <= size
    return hits, pinned


def _plain_request(obj_id: int) -> Any:
    import libcachesim as lcs

    return lcs.Request(obj_size=1, op=lcs.ReqOp.OP_READ, obj_id=obj_id, next_access_vtime=NEVER)


# --------------------------------------------------------------------------------------------
# tables


@dataclass
class Row:
    routing: str
    policy: str
    size: int
    engine: Hits
    sequential: Hits
    step: Hits | None


def crosscheck(top1_sizes: Sequence[int] = TOP1_SIZES, topk_sizes: Sequence[int] = TOPK_SIZES,
               policies: Sequence[str] = POLICIES) -> list[Row]:
    rows = []
    for routing, trace, sizes in (("top-1", top1_sample(), top1_sizes), ("top-6", load_sample(), topk_sizes)):
        for policy in policies:
            for size in sizes:
                eng = engine_hits(trace, policy, size)
                seq = peer_hits(trace, policy, size, "sequential")
                stp = peer_hits(trace, policy, size, "step") if trace.model.top_k > 1 else None
                rows.append(Row(routing, policy, size, eng, seq, stp))
    return rows


def same_steps(a: Hits, b: Hits) -> bool:
    """Equal hit counts at every layer step (so also in total)."""
    return len(a.steps) == len(b.steps) and all(np.array_equal(x, y) for x, y in zip(a.steps, b.steps, strict=True))


def format_table(rows: list[Row]) -> str:
    out = []
    for routing in dict.fromkeys(r.routing for r in rows):
        sub = [r for r in rows if r.routing == routing]
        acc = sub[0].engine.accesses
        out.append(f"\n{routing} ({acc} accesses per run)\n")
        if routing == "top-1":
            out.append("| policy | C | moesim hits | libCacheSim hits | moesim hit rate | libCacheSim hit rate | equal at every step |")
            out.append("|---|---:|---:|---:|---:|---:|:---:|")
            for r in sub:
                out.append(f"| {r.policy} | {r.size} | {r.engine.hits} | {r.sequential.hits} | "
                           f"{r.engine.rate:.4f} | {r.sequential.rate:.4f} | "
                           f"{'yes' if same_steps(r.engine, r.sequential) else 'NO'} |")
        else:
            out.append("| policy | C | moesim | libCacheSim sequential | diff (pp) | own-token victims (seq) "
                       "| libCacheSim step | pinned victims held (step) | step equal |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|:---:|")
            for r in sub:
                assert r.step is not None
                d = 100 * (r.engine.rate - r.sequential.rate)
                out.append(f"| {r.policy} | {r.size} | {r.engine.rate:.4f} ({r.engine.hits}) | "
                           f"{r.sequential.rate:.4f} ({r.sequential.hits}) | {d:+.2f} | "
                           f"{r.sequential.pinned_victims} | {r.step.rate:.4f} ({r.step.hits}) | "
                           f"{r.step.pinned_victims} | {'yes' if same_steps(r.engine, r.step) else 'NO'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top1-sizes", type=int, nargs="+", default=list(TOP1_SIZES))
    ap.add_argument("--topk-sizes", type=int, nargs="+", default=list(TOPK_SIZES))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    args = ap.parse_args(argv)
    import libcachesim

    t0 = time.perf_counter()
    rows = crosscheck(args.top1_sizes, args.topk_sizes, args.policies)
    print(f"moesim vs libcachesim {libcachesim.__version__} on {SAMPLE.relative_to(ROOT)}: "
          "batch 1, decode, every request, C experts per layer, cold start")
    print(format_table(rows))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
