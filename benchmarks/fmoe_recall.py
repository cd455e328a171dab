"""What fMoE's expert maps find in the routing the fMoE set replays, and what there is to find
(issue 32: is the set's miss the maps' recall, the policy, or the routing?).

    python benchmarks/fmoe_recall.py                                  # ~1 min on 2 shared cores
    python benchmarks/fmoe_recall.py --out benchmarks/results/fmoe_recall.md

Part 1, in the simulator: each model of ``measurements/fmoe-end-to-end.yaml`` (its base, the
12 GB rows' setup) run with fMoE, instrumented without changing a decision: the routed experts its
prefetches covered (``prefetch_recall``), the share of its prefetched bytes that were used
(``fetch_precision``), hit / late / miss, misses and demand stall per decode token, how many
experts the mass rule (Eqs. 6-8) picked per target layer, and the median semantic (Eq. 4) and
trajectory (Eq. 5) scores that set its threshold.

Part 2, offline on the same traces (and on the two recorded traces in ``traces/samples/``): the
decode tokens of the evaluated requests matched against a store of the profile's maps (one per
token, prompt tokens included, as the policy stores them, each with its iteration's embedding;
the store does not grow and is not capped here, where the policy's holds ``C`` = 1,000 and
replaces the most redundant), per target layer ``t >= d``:

- ``trajectory``: the top-k of the stored map whose layers ``0..t-d`` are most cosine-similar to
  the token's own (fMoE's Eq. 5), against the routed experts;
- split by whether the token's id has a stored decode map (``seen``) or not, beside the latest
  stored map of that id (``same-id map``: what a matcher that found it would guess);
- ``best stored map``: the highest recall any one stored map gives (a ceiling for any matcher of
  this store); ``semantic``: Eq. 4 for layers ``0..d-1``; ``previous token`` (per-request
  persistence) and ``lookahead`` (cross-layer: the next router on this layer's state, ``d = 1``).

Recall is ``|guess & routed| / k`` averaged over (token, layer); chance is ``k / E``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.paper_runs import run_scenario  # noqa: E402
from benchmarks.results_file import write_result  # noqa: E402
from moesim.policies.contract.registry import register  # noqa: E402
from moesim.policies.fmoe.expert_maps import select_floats  # noqa: E402
from moesim.policies.fmoe.map_cache import MapPriorityCache  # noqa: E402
from moesim.policies.fmoe.map_prefetch import ExpertMapPrefetcher  # noqa: E402
from moesim.policies.fmoe.policy import FMoE  # noqa: E402
from moesim.sim.config.scenario import set_key  # noqa: E402
from moesim.traces.analysis.recall import Routing, routing_arrays  # noqa: E402
from moesim.traces.format.trace_file import PREFILL, read_trace  # noqa: E402
from moesim.traces.synthetic.generator import generate, parse_params  # noqa: E402

SET = ROOT / "measurements" / "fmoe-end-to-end.yaml"
RECORDED = ("fine-moe", "tiny-moe")


class _CountingMaps(ExpertMapPrefetcher):
    """fMoE's prefetcher, recording each match's score and how many experts the mass rule took
    (the decisions are the parent's)."""

    def setup(self, ctx: Any) -> None:
        """The parent's set-up and empty tallies."""
        super().setup(ctx)
        self.scores: dict[str, list[float]] = {"semantic": [], "trajectory": []}
        self.sizes: dict[str, Counter[int]] = {"semantic": Counter(), "trajectory": Counter()}

    def _add(self, target: int, emap_row: list[float], score: float) -> None:
        kind = "semantic" if self._l_now < 0 else "trajectory"
        self.scores[kind].append(score)
        delta = min(max(1.0 - score, 0.0), 1.0)
        self.sizes[kind][len(select_floats(emap_row, delta, self._K, self.dynamic_threshold))] += 1
        super()._add(target, emap_row, score)


@register
class FMoECounting(FMoE):
    """fMoE with :class:`_CountingMaps` (same decisions): registered by this script only."""

    name = "fmoe-counting"
    summary = "diagnostic: fMoE that records its match scores and prefetch-set sizes (benchmarks/fmoe_recall.py)"

    def __init__(self, *, prefetch_distance: int = 3, store_capacity: int = 1000) -> None:
        super().__init__(prefetch_distance=prefetch_distance, store_capacity=store_capacity)
        maps = _CountingMaps(prefetch_distance=prefetch_distance, store_capacity=store_capacity)
        self.assemble(cache=MapPriorityCache(self.freq_smoothing, self.protect_window, maps=maps), prefetcher=maps)


def _setups() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The set's base, its 12 GB rows' ``set`` and their ``mean_over`` models."""
    doc = yaml.safe_load(SET.read_text())
    row = next(r for r in doc["rows"] if r["set"]["cache.gib"] == 12)
    base = doc["base"]
    if isinstance(base.get("runtime"), str):   # a profile file, named relative to the set's folder
        base["runtime"] = str((SET.parent / base["runtime"]).resolve())
    return base, row["set"], row["mean_over"]


def _scenario(base: dict[str, Any], *overs: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for over in overs:
        for k, v in over.items():
            set_key(data, k.split("."), v, k)
    return data


def in_simulator() -> list[str]:
    """Part 1 as Markdown lines."""
    base, own, setups = _setups()
    out = ["| model | prefetch recall | fetch precision | hit | late | miss | misses / token | "
           "stall ms / token | experts per target layer (share of sets) | median score: semantic, trajectory |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    pol = {"policy": {"name": "fmoe-counting", "params": {"prefetch_distance": 3, "store_capacity": 1000}}}
    for setup in setups:
        m, policy = run_scenario(_scenario(base, own, setup, pol))
        maps = policy.prefetcher
        assert isinstance(maps, _CountingMaps)
        sizes = maps.sizes["semantic"] + maps.sizes["trajectory"]
        total = sum(sizes.values())
        shares = ", ".join(f"{n}: {c / total:.2f}" for n, c in sorted(sizes.items()) if c / total >= 0.01)
        per_tok = m["misses"] / max(1, m["tokens"])
        out.append(f"| {setup['model']} | {m['prefetch_recall']:.3f} | {m['fetch_precision']:.3f} | "
                   f"{m['hit_rate']:.3f} | {m['late_rate']:.3f} | {m['miss_rate']:.3f} | {per_tok:.1f} | "
                   f"{m['stall_ms_per_token']:.1f} | {shares} | "
                   f"{statistics.median(maps.scores['semantic']):.3f}, "
                   f"{statistics.median(maps.scores['trajectory']):.3f} |")
    return out


def _iterations(r: Routing) -> list[tuple[int, int, bool]]:
    """``(first token, end token, prefill)`` of every iteration at batch 1: a request's prompt is
    one iteration, each decode token another."""
    its, i, n = [], 0, len(r.request)
    while i < n:
        j = i + 1
        if r.phase[i] == PREFILL:
            while j < n and r.request[j] == r.request[i] and r.phase[j] == PREFILL:
                j += 1
        its.append((i, j, bool(r.phase[i] == PREFILL)))
        i = j
    return its


def _recall(guess: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """``|guess & routed| / k`` per row of ``[n, k]`` arrays."""
    return (guess[:, :, None] == routed[:, None, :]).any(axis=2).sum(axis=1) / routed.shape[1]


def map_structure(r: Routing, profile_requests: int, d: int = 3) -> dict[str, float]:
    """Part 2's figures for one trace (see the module docstring); ``profile_requests``: the first
    requests, in order of appearance, whose iterations fill the store."""
    L, E, k = r.num_layers, r.num_experts, r.top_k
    prof = set(list(dict.fromkeys(r.request.tolist()))[:profile_requests])
    its = _iterations(r)
    # one stored map per profile token (as the policy stores them), with its iteration's first row
    stored = [(t, a) for a, b, _ in its if r.request[a] in prof for t in range(a, b)]
    maps = np.stack([r.probs[t] for t, _ in stored]).astype(np.float64)   # [M, L, E]
    ids = np.array([-1 if r.token_id is None else r.token_id[t] for t, _ in stored])
    evals = np.array([a for a, _, pre in its if not pre and r.request[a] not in prof])
    top = np.argsort(-maps, axis=2, kind="stable")[:, :, :k]   # [M, L, k]
    seen = np.isin(r.token_id[evals], ids[ids >= 0]) if r.token_id is not None else np.zeros(len(evals), bool)
    traj, same, best = [], [], []
    for t in range(d, L):
        flat = maps[:, : t - d + 1].reshape(len(maps), -1)
        q = r.probs[evals, : t - d + 1].reshape(len(evals), -1).astype(np.float64)
        cos = (q @ flat.T) / np.maximum(np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(flat, axis=1)[None], 1e-30)
        routed = r.experts[evals, t]
        traj.append(_recall(top[np.argmax(cos, axis=1), t], routed))
        all_maps = (top[None, :, t, :, None] == routed[:, None, None, :]).any(axis=3).sum(axis=2)   # [n, M]
        best.append(all_maps.max(axis=1) / k)
        if r.token_id is not None:
            latest = {int(w): i for i, w in enumerate(ids) if w >= 0}
            same.append(np.array([all_maps[j, latest[int(w)]] / k if int(w) in latest else np.nan
                                  for j, w in enumerate(r.token_id[evals])]))
    tr = np.stack(traj)   # [L - d, n]
    out = {"chance": k / E, "tokens": float(len(evals)), "store": float(len(maps)), "trajectory": float(tr.mean()),
           "best": float(np.mean(best)), "seen_share": float(seen.mean()) if len(seen) else float("nan")}
    out["trajectory_seen"] = float(tr[:, seen].mean()) if seen.any() else float("nan")
    out["trajectory_unseen"] = float(tr[:, ~seen].mean()) if (~seen).any() else float("nan")
    out["same_id_map"] = float(np.nanmean(np.stack(same))) if same and seen.any() else float("nan")
    if r.embedding is not None:
        emb = r.embedding
        sem = np.stack([emb[a] for _, a in stored])
        cs = (emb[evals] @ sem.T) / np.maximum(np.linalg.norm(emb[evals], axis=1)[:, None]
                                               * np.linalg.norm(sem, axis=1)[None], 1e-30)
        y = np.argmax(cs, axis=1)
        out["semantic"] = float(np.mean([_recall(top[y, t], r.experts[evals, t]) for t in range(min(d, L))]))
    prev = evals[(evals > 0) & (r.request[np.maximum(evals - 1, 0)] == r.request[evals])]
    out["previous_token"] = float(np.mean([_recall(r.experts[prev - 1, t], r.experts[prev, t]) for t in range(L)]))
    if r.lookahead is not None:
        look = np.argsort(-r.lookahead[evals].astype(np.float64), axis=2, kind="stable")[:, :, :k]
        out["lookahead"] = float(np.mean([_recall(look[:, t - 1], r.experts[evals, t]) for t in range(1, L)]))
    return out


def offline() -> list[str]:
    """Part 2 as Markdown lines."""
    base, _own, setups = _setups()
    out = ["| trace | chance | store maps | decode tokens | trajectory@3 | ids seen | trajectory, seen ids | "
           "same-id map | trajectory, unseen ids | best stored map | semantic | previous token | lookahead |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    traces: list[tuple[str, Routing, int]] = []
    prof = int(base["profile"]["requests"])
    for setup in setups:
        data = _scenario(base, setup)
        cols, meta = generate(parse_params(dict(data["trace"]["synthetic"])))
        traces.append((f"{setup['model']} (the set's synthetic trace)", routing_arrays(cols, meta.model), prof))
    for name in RECORDED:
        tr = read_trace(ROOT / "traces" / "samples" / f"{name}.parquet")
        r = routing_arrays(tr.columns(), tr.meta.model)
        n = len(dict.fromkeys(r.request.tolist()))
        traces.append((f"{name} (recorded, byte vocabulary)", r, int(0.7 * n)))
    for label, r, p in traces:
        f = map_structure(r, p)
        cells = [f"{f[c]:.3f}" if c in f else "-" for c in
                 ("trajectory", "seen_share", "trajectory_seen", "same_id_map", "trajectory_unseen", "best",
                  "semantic", "previous_token", "lookahead")]
        out.append(f"| {label} | {f['chance']:.3f} | {f['store']:.0f} | {f['tokens']:.0f} | {' | '.join(cells)} |")
    return out


def report() -> str:
    """The whole report as Markdown."""
    t0 = time.perf_counter()
    text = ["# What fMoE's expert maps find", "",
            "Written by `python benchmarks/fmoe_recall.py --out benchmarks/results/fmoe_recall.md` from",
            "`measurements/fmoe-end-to-end.yaml` (its base and the 12 GB rows' setup; see the script's docstring).", "",
            "## In the simulator: fMoE at 12 GB, each model", "", *in_simulator(), "",
            "## Offline: what the maps can find in each trace (decode tokens of the evaluated requests)", "",
            *offline(), "", f"({time.perf_counter() - t0:.0f} s)"]
    return "\n".join(text) + "\n"


def main() -> None:
    """Print the report, or write it with ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the Markdown here (under benchmarks/results/)")
    args = ap.parse_args()
    text = report()
    if args.out:
        write_result(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
