"""Fit the synthetic generator (:mod:`traces.synthetic`) to a recorded trace or to target
statistics (:mod:`traces.synthetic.fit_targets`).

Each knob is fitted to one statistic (its *driver*):

* ``popularity_skew`` -> popularity entropy (mean over layers, ``trace stats``), or without
  it the ``popularity`` recall;
* ``token_locality`` -> per-layer token-to-token **reuse** (a per-layer profile), or without
  it the ``previous_token`` recall (one value);
* ``topic_strength`` only when reuse stays above the target even with independent tokens
  (the request-level topic sets a floor on reuse): it is lowered until the floor meets it;
* ``lookahead_quality`` -> the ``lookahead`` recall (it can only lower the lookahead below what
  the layer correlation gives);
* ``layer_correlation`` -> next-layer accuracy of ``lookahead_logits`` (``next_layer_acc``, or
  the ``lookahead`` recall) when ``lookahead_quality`` is not fitted; when it is, the
  ``transition@1`` recall (co-routing of consecutive layers), or held without one;
* ``token_strength`` -> the ``trajectory@1`` recall (else ``semantic``, else ``same_token``).

A knob without its statistic in the target keeps its base value and the report says so. The
model's shape comes from the target; the other knobs (number of topics, temperature, latent
size, vocabulary) keep their base values (a preset or the defaults). Every statistic is
measured on generated calibration traces of about the target's workload (capped at
:data:`CALIB_TOKENS` tokens, :data:`CALIB_RECALL_TOKENS` when recall is targeted, with the
target's profile share) with one seed, so the calibration curves share their random numbers
(common random numbers) and bisection is monotone up to sampling noise. Steps: bisect each
knob on its statistic in the order above (skew, token strength, layer correlation, lookahead
quality, locality), twice round; then, with a per-layer reuse target, map each layer's
reuse through per-layer calibration curves (reuse against a scalar locality) to a locality per
layer, and correct once by the measured error over the curve's slope. Reuse at layer ``l``
depends only on the lag-1 token correlation of that layer's state, which the profile sets
directly (see :func:`traces.synthetic.innovation_locality`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moesim.sim.config.catalog import model_names
from moesim.sim.core.errors import MoesimError
from moesim.traces.analysis.recall import MEASURES, recall_stats, routing_arrays, trace_recall
from moesim.traces.analysis.stats import trace_stats
from moesim.traces.format.trace_file import read_trace
from moesim.traces.importers.common import model_info
from moesim.traces.synthetic.fit_targets import FitTarget
from moesim.traces.synthetic.generator import SynthParams, generate, parse_params

__all__ = ["ALL_KNOBS", "FIT_KNOBS", "RECALL_KNOBS", "FitResult", "FitTarget", "Measured", "fit", "fit_trace",
           "measure", "trace_tokens"]

CALIB_TOKENS = 2048  # tokens per calibration trace (cap)
CALIB_RECALL_TOKENS = 8192  # the cap when recall is targeted (the map store needs the target's size)
FIT_KNOBS = ("popularity_skew", "layer_correlation", "token_locality", "topic_strength")
"""The knobs :func:`fit` fits by default (those of the trace statistics)."""
RECALL_KNOBS = ("token_strength", "lookahead_quality")
"""Knobs that only prediction-recall targets drive."""
ALL_KNOBS = (*FIT_KNOBS, *RECALL_KNOBS)
"""Every fittable knob."""
_BISECT_STEPS = 7
_CORRECTIONS = 2  # measured-error corrections of the per-layer profile


@dataclass(frozen=True)
class Measured:
    """Statistics of one generated trace (same definitions as :mod:`traces.stats` and
    :mod:`traces.analysis.recall`; ``recall`` is empty unless asked for)."""

    reuse: np.ndarray  # [L]
    entropy: float
    top10_share: float
    next_layer_acc: float | None
    recall: dict[str, float | None] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """Statistic ``name`` (``reuse``: the mean over layers)."""
        if name == "reuse":
            return float(np.mean(self.reuse))
        if name in ("entropy", "next_layer_acc"):
            return getattr(self, name)
        return self.recall.get(name)


@dataclass
class FitResult:
    """A fit: the fitted parameters, the target, what the fitted generator gives at the
    calibration size, and the knobs that were held at their base values (with why)."""

    params: SynthParams
    target: FitTarget
    achieved: Measured
    held: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, float | None, float | None]]:
        """``(statistic, target, fitted)`` per layer's reuse, then entropy, next-layer
        accuracy and the recall measures the target has (``None`` where the target has no
        value)."""
        out: list[tuple[str, float | None, float | None]] = [
            (f"reuse layer {lay}", t, float(a))
            for lay, (t, a) in enumerate(zip(self.target.reuse, self.achieved.reuse, strict=False))]
        if self.target.reuse:
            out.append(("reuse mean", float(np.mean(self.target.reuse)), float(np.mean(self.achieved.reuse))))
        out.append(("entropy (mean)", self.target.entropy, self.achieved.entropy))
        out.append(("next-layer acc", self.target.next_layer_acc, self.achieved.next_layer_acc))
        out += [(m, self.target.recall[m], self.achieved.recall.get(m)) for m in MEASURES if m in self.target.recall]
        return out

    def synthetic_yaml(self) -> dict[str, Any]:
        """The fitted parameters as a ``trace: {synthetic: ...}`` mapping (only the fields
        that differ from the defaults, so the file reads as the fit)."""
        defaults = parse_params({})
        data = self.params.model_dump()
        keep = {k: v for k, v in data.items() if k == "model" or v != getattr(defaults, k)}
        if isinstance(keep.get("token_locality"), list):
            keep["token_locality"] = [round(float(x), 4) for x in keep["token_locality"]]
        for key in ("popularity_skew", "layer_correlation", "topic_strength", "token_strength", "lookahead_quality"):
            if key in keep:
                keep[key] = round(float(keep[key]), 4)
        return {"synthetic": keep}


# --------------------------------------------------------------------------------------------
# Measuring a generated trace


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a[..., :, None] == b[..., None, :]).sum(axis=(-1, -2))


def measure(params: SynthParams, *, recall: bool = False, profile_requests: int | None = None) -> Measured:
    """Generate ``params`` in memory and compute its reuse per layer, mean popularity entropy,
    top-10% share and next-layer accuracy exactly as :func:`traces.stats.trace_stats` does,
    and with ``recall`` the overall prediction recall of
    :func:`traces.analysis.recall.recall_stats` (decode tokens, ``profile_requests``)."""
    cols, meta = generate(params)
    m = meta.model
    L, E, k = m.num_layers, m.num_experts, m.top_k
    T = len(cols["request_id"]) // L
    ex = cols["experts"].reshape(T, L, k).astype(np.int64)
    req = cols["request_id"][::L]
    cont = np.zeros(T, dtype=bool)
    cont[1:] = req[1:] == req[:-1]
    prev = np.concatenate([ex[:1], ex[:-1]])
    n = int(cont.sum())
    reuse = _overlap(ex[cont], prev[cont]).sum(axis=0) / (n * k) if n else np.full(L, math.nan)
    counts = np.stack([np.bincount(ex[:, lay].ravel(), minlength=E) for lay in range(L)]).astype(np.float64)
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -(np.where(p > 0, p * np.log(p), 0.0)).sum(axis=1) / math.log(E) if E > 1 else np.ones(L)
    n_top = max(1, math.ceil(E / 10))
    top10 = float(np.mean(np.sort(counts, axis=1)[:, ::-1][:, :n_top].sum(axis=1) / counts.sum(axis=1)))
    acc = None
    look = cols.get("lookahead_logits")
    if look is not None:
        lk = look.reshape(T * L, E).astype(np.float32)
        top = (np.argpartition(-lk, k - 1, axis=1)[:, :k] if k < E
               else np.broadcast_to(np.arange(E), (T * L, E))).reshape(T, L, k)
        s = float(_overlap(top[:, :-1], ex[:, 1:]).sum()) if L > 1 else 0.0
        cnt = T * (L - 1)
        prev_top = np.concatenate([top[:1, -1], top[:-1, -1]])
        s += float(_overlap(prev_top[cont], ex[cont, 0]).sum())
        cnt += n
        acc = s / (cnt * k) if cnt else None
    rec = recall_stats(routing_arrays(cols, m), profile_requests=profile_requests).overall if recall else {}
    return Measured(reuse=np.asarray(reuse, dtype=np.float64), entropy=float(np.mean(ent)), top10_share=top10,
                    next_layer_acc=acc, recall=rec)


# --------------------------------------------------------------------------------------------
# The fit


def _bisect(f: Callable[[float], float], want: float, lo: float, hi: float, *, increasing: bool) -> float:
    """The knob value in ``[lo, hi]`` where the (monotone, noisy) ``f`` meets ``want``."""
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        above = f(mid) > want
        if above == increasing:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def _calibration_workload(target: FitTarget, cap: int = CALIB_TOKENS, max_requests: int = 16) -> dict[str, int]:
    per_req = max(2, target.prompt_len + target.decode_len)
    requests = max(1, min(target.requests, max_requests, cap // per_req))
    scale = min(1.0, cap / (requests * per_req))
    prompt = int(round(target.prompt_len * scale))
    decode = max(2 if prompt == 0 else 1, int(round(target.decode_len * scale)))
    return {"requests": requests, "prompt_len": prompt, "decode_len": decode}


def _drivers(target: FitTarget, knobs: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(driver statistic per fitted knob, why per held knob)`` (module docstring)."""
    rec = target.recall
    drive: dict[str, str] = {}
    held: dict[str, str] = {}

    def first(*names: str) -> str | None:
        return next((n for n in names if target.value(n) is not None), None)

    q_fits = "lookahead_quality" in knobs and "lookahead" in rec
    c_stat = first("transition@1") if q_fits else first("next_layer_acc", "lookahead")
    choices = {
        "popularity_skew": first("entropy", "popularity"),
        "token_strength": first("trajectory@1", "semantic", "same_token"),
        "layer_correlation": c_stat,
        "lookahead_quality": "lookahead" if q_fits else None,
        "token_locality": first("reuse", "previous_token"),
        "topic_strength": first("reuse", "previous_token"),
    }
    why = {
        "popularity_skew": "the target has neither entropy nor popularity",
        "token_strength": "the target has none of trajectory@1, semantic, same_token",
        "layer_correlation": "lookahead_quality takes the lookahead target and there is no transition@1 target"
        if q_fits else "the target has no lookahead_logits" if not rec
        else "the target has neither next_layer_acc nor lookahead",
        "lookahead_quality": "the target has no lookahead recall",
        "token_locality": "the target has neither reuse nor previous_token",
        "topic_strength": "the target has neither reuse nor previous_token",
    }
    for k in ALL_KNOBS:
        if k not in knobs:
            held[k] = "held at its base value"
        elif choices[k] is None:
            held[k] = why[k]
        else:
            drive[k] = str(choices[k])
    return drive, held


def _curve(stat: Callable[..., float], name: str, knob: str, **fixed: Any) -> Callable[[float], float]:
    """Statistic ``name`` as a function of ``knob`` (other overrides ``fixed``)."""
    return lambda v: stat(name, **fixed, **{knob: v})


_RANGE = {"popularity_skew": (0.0, 4.0), "layer_correlation": (0.0, 0.999), "lookahead_quality": (0.0, 1.0),
          "token_locality": (0.0, 0.995)}


def fit(
    target: FitTarget, *, base: dict[str, Any] | None = None, knobs: Iterable[str] = FIT_KNOBS,
    seed: int = 0, workload: dict[str, int] | None = None,
) -> FitResult:
    """Fit :data:`FIT_KNOBS` (or the subset of :data:`ALL_KNOBS` in ``knobs``) to ``target``,
    starting from ``base`` (generator parameters, e.g. ``{"preset": "mixtral-8x7b"}``; shape
    fields are taken from the target). ``workload`` (requests, prompt_len, decode_len) sets
    the calibration traces; default: the target's, capped at :data:`CALIB_TOKENS` tokens
    (:data:`CALIB_RECALL_TOKENS` with recall targets). The returned parameters carry the
    target's workload and ``seed``."""
    knobs = set(knobs)
    unknown = knobs - set(ALL_KNOBS)
    if unknown:
        raise MoesimError(f"cannot fit {sorted(unknown)} (fittable: {', '.join(ALL_KNOBS)})")
    shape: dict[str, Any] = {"model": target.model}
    dims = {"num_layers": target.num_layers, "num_experts": target.num_experts, "top_k": target.top_k}
    if target.model not in model_names() or any(getattr(model_info(target.model), k) != v for k, v in dims.items()):
        shape.update(dims)
    vocab = {"vocab_size": target.vocab_size, "zipf_s": round(float(target.zipf_s or 0.0), 4),
             "token_repeat": round(float(target.token_repeat or 0.0), 4)} \
        if target.vocab_size is not None and "token_strength" in knobs else {}
    start = parse_params({**(base or {}), **shape, **vocab, "seed": seed})
    with_recall = bool(target.recall)
    calib = {**(workload or (_calibration_workload(target, CALIB_RECALL_TOKENS, 64) if with_recall
                             else _calibration_workload(target))), "seed": seed, "length_jitter": 0.0}
    prof = None
    if with_recall and target.profile_share is not None and calib["requests"] > 1:
        n_req = int(calib["requests"])
        prof = min(n_req - 1, max(1, round(target.profile_share * n_req)))
    drive, held = _drivers(target, knobs)
    cur: dict[str, Any] = {k: getattr(start, k) for k in ALL_KNOBS}
    if "token_locality" in drive:
        cur["token_locality"] = float(np.mean(start.locality_profile()))
    emit = with_recall or drive.get("layer_correlation") == "next_layer_acc"

    def params(**over: Any) -> SynthParams:
        return start.model_copy(update={**calib, **cur, "emit_logits": emit, **over})

    def stat(name: str, **over: Any) -> float:
        v = measure(params(**over), recall=name in MEASURES, profile_requests=prof).value(name)
        return 0.0 if v is None else float(v)

    order = ("popularity_skew", "token_strength", "layer_correlation", "lookahead_quality", "token_locality")
    for _ in range(2 if len(drive) > 1 else 1):
        for knob in order:
            if knob not in drive:
                continue
            name = drive[knob]
            want = target.value(name)
            assert want is not None  # a driver is a statistic the target has
            lo, hi = _RANGE.get(knob, (0.0, 0.999 * math.sqrt(max(0.0, 1.0 - float(cur["topic_strength"]) ** 2))))
            cur[knob] = _bisect(_curve(stat, name, knob), want, lo, hi, increasing=name != "entropy")
            if knob == "token_locality" and "topic_strength" in drive and cur["token_locality"] < 0.01:
                # even independent tokens reuse too much: the request's topic sets the floor
                floor = _curve(stat, name, "topic_strength", token_locality=0.0)
                if floor(cur["topic_strength"]) > want:
                    cur["topic_strength"] = _bisect(floor, want, 0.0, float(cur["topic_strength"]), increasing=True)
    if drive.get("token_locality") == "reuse" and target.num_layers > 1:
        cur["token_locality"] = _per_layer(target, params, float(cur["token_locality"]))
    final = params()
    achieved = measure(final, recall=with_recall, profile_requests=prof)
    out = start.model_copy(update={**cur, "requests": target.requests, "prompt_len": target.prompt_len,
                                   "decode_len": target.decode_len, "seed": seed})
    return FitResult(params=parse_params(_dump(out)), target=target, achieved=achieved, held=held)


def _dump(p: SynthParams) -> dict[str, Any]:
    data = p.model_dump()
    data.pop("preset", None)
    return data


def _per_layer(target: FitTarget, params: Callable[..., SynthParams], loc: float) -> list[float]:
    """A locality per layer meeting each layer's reuse: invert per-layer calibration curves
    (reuse at a scalar locality), then correct once by the measured error over the slope."""
    grid = np.unique(np.clip(np.concatenate([np.linspace(0.0, 0.9, 10), [0.95, 0.99], [loc]]), 0.0, 0.995))
    curves = np.stack([measure(params(token_locality=float(g))).reuse for g in grid])  # [G, L]
    want = np.asarray(target.reuse, dtype=np.float64)
    curves = np.maximum.accumulate(curves, axis=0)  # monotone in the locality (noise aside)
    prof = np.array([np.interp(want[lay], curves[:, lay] + 1e-9 * np.arange(len(grid)), grid)
                     for lay in range(target.num_layers)])
    # local slope of each layer's curve at its chosen locality
    idx = np.clip(np.searchsorted(grid, prof), 1, len(grid) - 1)
    rise = curves[idx, np.arange(target.num_layers)] - curves[idx - 1, np.arange(target.num_layers)]
    slope = np.maximum(rise / (grid[idx] - grid[idx - 1]), 0.05)

    def err(profile: np.ndarray) -> tuple[float, np.ndarray]:
        got = measure(params(token_locality=[float(x) for x in profile])).reuse
        return float(np.abs(got - want).max()), got

    best_err, got = err(prof)
    best = prof
    for _ in range(_CORRECTIONS):
        prof = np.clip(prof + (want - got) / slope, 0.0, 0.995)
        new_err, got = err(prof)
        if new_err < best_err:
            best, best_err = prof, new_err
    return [float(x) for x in best]


def fit_trace(
    path: str | os.PathLike[str], *, base: dict[str, Any] | None = None, knobs: Iterable[str] = FIT_KNOBS,
    seed: int = 0, profile_requests: int | None = None,
) -> FitResult:
    """:func:`fit` to the statistics of the trace file at ``path``; its prediction recall
    (profile split ``profile_requests``) joins the target when ``knobs`` hold any of
    :data:`RECALL_KNOBS`."""
    knobs = list(knobs)
    rec = trace_recall(path, profile_requests=profile_requests) if set(knobs) & set(RECALL_KNOBS) else None
    return fit(FitTarget.from_stats(trace_stats(path, cache_sizes=[1]), rec, trace_tokens(path)), base=base,
               knobs=knobs, seed=seed)


def trace_tokens(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(token_id, request_id)`` of every token of a trace file (``None`` without token ids)."""
    tr = read_trace(path, ["token_id"])
    L = tr.model.num_layers
    return None if tr.token_id is None else (tr.token_id[::L], tr.request_id[::L])
