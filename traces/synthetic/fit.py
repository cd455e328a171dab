"""Fit the synthetic generator (:mod:`traces.synthetic`) to a recorded trace.

The statistics matched are those of ``simctl trace stats`` (:mod:`traces.stats`):

* per-layer token-to-token **reuse** -> ``token_locality`` as a per-layer profile;
* **popularity skew**, read as the mean per-layer entropy of expert popularity ->
  ``popularity_skew``;
* **cross-layer correlation**, read as next-layer prediction accuracy from
  ``lookahead_logits`` -> ``layer_correlation`` (only when the target trace has lookahead
  logits; otherwise the knob keeps its base value and the report says so);
* ``topic_strength`` only when reuse stays above the target even with independent tokens
  (the request-level topic sets a floor on reuse): it is lowered until the floor meets it.

The model's shape comes from the target's metadata; the other knobs (number of topics,
temperature, latent size) keep their base values (a preset or the defaults), since these statistics do
not pin them down. Every statistic is measured on generated calibration traces of about the
target's workload (capped at :data:`CALIB_TOKENS` tokens) with one seed, so the calibration
curves share their random numbers (common random numbers) and bisection is monotone up to
sampling noise. Steps: bisect the skew on entropy, the layer correlation on next-layer
accuracy and a scalar locality on mean reuse (twice round); then map each layer's target
reuse through per-layer calibration curves (reuse against a scalar locality) to a locality
per layer, and correct once by the measured error over the curve's slope. Reuse at layer
``l`` depends only on the lag-1 token correlation of that layer's state, which the profile
sets directly (see :func:`traces.synthetic.innovation_locality`).
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
from moesim.traces.analysis.stats import TraceStats, trace_stats
from moesim.traces.importers.common import model_info
from moesim.traces.synthetic.generator import SynthParams, generate, parse_params

CALIB_TOKENS = 2048  # tokens per calibration trace (cap)
FIT_KNOBS = ("popularity_skew", "layer_correlation", "token_locality", "topic_strength")
_BISECT_STEPS = 7
_CORRECTIONS = 2  # measured-error corrections of the per-layer profile


@dataclass(frozen=True)
class FitTarget:
    """The statistics a fit matches, with the shape and workload they came from."""

    model: str
    num_layers: int
    num_experts: int
    top_k: int
    reuse: tuple[float, ...]  # per layer, share of the top-k shared with the previous token
    entropy: float  # mean over layers of popularity entropy / log E
    next_layer_acc: float | None  # pooled over layers; None without lookahead logits
    requests: int = 8
    prompt_len: int = 64
    decode_len: int = 64

    @classmethod
    def from_stats(cls, st: TraceStats) -> FitTarget:
        """The target of a trace's :class:`traces.stats.TraceStats`. Its workload is the mean
        prompt and decode tokens per request."""
        m = st.meta.model
        if any(x.reuse is None for x in st.layers):
            raise MoesimError(f"{st.path}: no token has a previous token in its request; reuse is undefined")
        req = max(1, st.requests)
        return cls(
            model=m.name, num_layers=m.num_layers, num_experts=m.num_experts, top_k=m.top_k,
            reuse=tuple(float(x.reuse) for x in st.layers if x.reuse is not None),
            entropy=float(st.overall.entropy), next_layer_acc=st.overall.next_layer_acc,
            requests=req, prompt_len=round(st.tokens_by_phase.get("prefill", 0) / req),
            decode_len=round(st.tokens_by_phase.get("decode", 0) / req),
        )


@dataclass(frozen=True)
class Measured:
    """Statistics of one generated trace (same definitions as :mod:`traces.stats`)."""

    reuse: np.ndarray  # [L]
    entropy: float
    top10_share: float
    next_layer_acc: float | None


@dataclass
class FitResult:
    """A fit: the fitted parameters, the target, what the fitted generator gives at the
    calibration size, and the knobs that were held at their base values (with why)."""

    params: SynthParams
    target: FitTarget
    achieved: Measured
    held: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, float | None, float | None]]:
        """``(statistic, target, fitted)`` per layer's reuse, then entropy and next-layer
        accuracy (``None`` where the target has no value)."""
        out: list[tuple[str, float | None, float | None]] = [
            (f"reuse layer {lay}", t, float(a))
            for lay, (t, a) in enumerate(zip(self.target.reuse, self.achieved.reuse, strict=True))]
        out.append(("reuse mean", float(np.mean(self.target.reuse)), float(np.mean(self.achieved.reuse))))
        out.append(("entropy (mean)", self.target.entropy, self.achieved.entropy))
        out.append(("next-layer acc", self.target.next_layer_acc, self.achieved.next_layer_acc))
        return out

    def synthetic_yaml(self) -> dict[str, Any]:
        """The fitted parameters as a ``trace: {synthetic: ...}`` mapping (only the fields
        that differ from the defaults, so the file reads as the fit)."""
        defaults = parse_params({})
        data = self.params.model_dump()
        keep = {k: v for k, v in data.items() if k == "model" or v != getattr(defaults, k)}
        if isinstance(keep.get("token_locality"), list):
            keep["token_locality"] = [round(float(x), 4) for x in keep["token_locality"]]
        for key in ("popularity_skew", "layer_correlation", "topic_strength"):
            if key in keep:
                keep[key] = round(float(keep[key]), 4)
        return {"synthetic": keep}


# --------------------------------------------------------------------------------------------
# Measuring a generated trace


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a[..., :, None] == b[..., None, :]).sum(axis=(-1, -2))


def measure(params: SynthParams) -> Measured:
    """Generate ``params`` in memory and compute its reuse per layer, mean popularity entropy,
    top-10% share and next-layer accuracy exactly as :func:`traces.stats.trace_stats` does."""
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
    return Measured(reuse=np.asarray(reuse, dtype=np.float64), entropy=float(np.mean(ent)), top10_share=top10,
                    next_layer_acc=acc)


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


def _calibration_workload(target: FitTarget) -> dict[str, int]:
    per_req = max(2, target.prompt_len + target.decode_len)
    requests = max(1, min(target.requests, 16, CALIB_TOKENS // per_req))
    scale = min(1.0, CALIB_TOKENS / (requests * per_req))
    prompt = int(round(target.prompt_len * scale))
    decode = max(2 if prompt == 0 else 1, int(round(target.decode_len * scale)))
    return {"requests": requests, "prompt_len": prompt, "decode_len": decode}


def fit(
    target: FitTarget, *, base: dict[str, Any] | None = None, knobs: Iterable[str] = FIT_KNOBS,
    seed: int = 0, workload: dict[str, int] | None = None,
) -> FitResult:
    """Fit :data:`FIT_KNOBS` (or the subset ``knobs``) to ``target``, starting from ``base``
    (generator parameters, e.g. ``{"preset": "mixtral-8x7b"}``; shape fields are taken from
    the target). ``workload`` (requests, prompt_len, decode_len) sets the calibration traces;
    default: the target's, capped at :data:`CALIB_TOKENS` tokens. The returned parameters
    carry the target's workload and ``seed``."""
    knobs = set(knobs)
    unknown = knobs - set(FIT_KNOBS)
    if unknown:
        raise MoesimError(f"cannot fit {sorted(unknown)} (fittable: {', '.join(FIT_KNOBS)})")
    shape: dict[str, Any] = {"model": target.model}
    dims = {"num_layers": target.num_layers, "num_experts": target.num_experts, "top_k": target.top_k}
    if target.model not in model_names() or any(getattr(model_info(target.model), k) != v for k, v in dims.items()):
        shape.update(dims)
    start = parse_params({**(base or {}), **shape, "seed": seed})
    calib = {**(workload or _calibration_workload(target)), "seed": seed, "length_jitter": 0.0}
    held: dict[str, str] = {}
    want_acc = target.next_layer_acc
    if "layer_correlation" in knobs and want_acc is None:
        knobs.discard("layer_correlation")
        held["layer_correlation"] = "the target has no lookahead_logits"
    for k in set(FIT_KNOBS) - knobs:
        held.setdefault(k, "held at its base value")
    cur: dict[str, Any] = {"popularity_skew": start.popularity_skew, "layer_correlation": start.layer_correlation,
                           "token_locality": start.token_locality, "topic_strength": start.topic_strength}
    if "token_locality" in knobs:
        cur["token_locality"] = float(np.mean(start.locality_profile()))
    emit = want_acc is not None and "layer_correlation" in knobs

    def params(**over: Any) -> SynthParams:
        return start.model_copy(update={**calib, **cur, "emit_logits": emit, **over})

    want_reuse = float(np.mean(target.reuse))
    for _ in range(2 if len(knobs) > 1 else 1):
        if "popularity_skew" in knobs:
            cur["popularity_skew"] = _bisect(lambda v: measure(params(popularity_skew=v)).entropy,
                                             target.entropy, 0.0, 4.0, increasing=False)
        if "layer_correlation" in knobs and want_acc is not None:
            acc_of = lambda v: measure(params(layer_correlation=v)).next_layer_acc or 0.0  # noqa: E731
            cur["layer_correlation"] = _bisect(acc_of, want_acc, 0.0, 0.999, increasing=True)
        if "token_locality" in knobs:
            cur["token_locality"] = _bisect(lambda v: float(np.mean(measure(params(token_locality=v)).reuse)),
                                            want_reuse, 0.0, 0.995, increasing=True)
            if "topic_strength" in knobs and cur["token_locality"] < 0.01:
                # even independent tokens reuse too much: the request's topic sets the floor
                floor = lambda v: float(np.mean(measure(params(token_locality=0.0, topic_strength=v)).reuse))  # noqa: E731
                if floor(cur["topic_strength"]) > want_reuse:
                    cur["topic_strength"] = _bisect(floor, want_reuse, 0.0, float(cur["topic_strength"]),
                                                    increasing=True)
    if "token_locality" in knobs and target.num_layers > 1:
        cur["token_locality"] = _per_layer(target, params, float(cur["token_locality"]))
    final = params()
    achieved = measure(final)
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
    seed: int = 0,
) -> FitResult:
    """:func:`fit` to the statistics of the trace file at ``path``."""
    return fit(FitTarget.from_stats(trace_stats(path, cache_sizes=[1])), base=base, knobs=knobs, seed=seed)
