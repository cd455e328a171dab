"""What ``simctl trace fit`` aims at: the statistics of a recorded trace, or values given by
hand (a YAML file or ``--target NAME=VALUE``), each optionally with its source.

Statistic names: ``reuse`` (token-to-token reuse, per layer from a trace, one value for all
layers, or a list: a per-layer profile stretched linearly over the layers), ``entropy`` (mean
popularity entropy / log E), ``next_layer_acc`` (lookahead accuracy over all tokens) and
``lru@C`` (the LRU hit rate with ``C`` experts of each layer cached, pooled over the layers,
every token in trace order), as ``simctl trace stats`` defines them, ``top@C`` (the share of
all selections that go to the ``C`` most popular experts of their layer, averaged over the
layers: ``top10_share`` of the stats at ``C = ceil(E / 10)``), and the
prediction-recall measures of :mod:`traces.analysis.recall` (``lookahead``,
``transition@1..3``, ``previous_token``, ``same_token``, ``popularity``, ``semantic``,
``trajectory@1..3``), measured on the decode tokens of the requests outside the profile split.

A targets file is a mapping from statistic to either a number or ``{value: NUMBER, source:
TEXT, metric: TEXT, tolerance: NUMBER}`` (all but ``value`` optional): ``source`` is where the
value comes from (printed beside target and achieved), ``metric`` how a published figure was
mapped onto moesim's statistic, ``tolerance`` the absolute difference within which the target
counts as met (:data:`DEFAULT_TOLERANCE` without it)::

    lookahead: {value: 0.62, source: "recorded tiny MoE, moesim issue 22", tolerance: 0.03}
    previous_token: 0.44
    reuse: {value: [0.26, 0.32], source: "rises with depth"}
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.yamlio import load_yaml_file
from moesim.traces.analysis.recall import MEASURES, RecallStats
from moesim.traces.analysis.stats import TraceStats

TRACE_STATS = ("reuse", "entropy", "next_layer_acc")
STAT_NAMES = (*TRACE_STATS, *MEASURES, "lru@C", "top@C")
"""Every statistic a fit can target (``lru@C`` and ``top@C`` stand for any size ``C >= 1``)."""
DEFAULT_TOLERANCE = 0.03
"""Absolute difference within which a target counts as met when its entry names none."""
_SIZED = re.compile(r"^(lru|top)@([1-9][0-9]*)$")
TargetValue = float | tuple[float, ...]
"""A target: a number, or (``reuse`` only) a per-layer profile."""


def sized_stat(name: str) -> tuple[str, int] | None:
    """``("lru", C)`` or ``("top", C)`` for a statistic named ``lru@C`` or ``top@C``, else ``None``."""
    m = _SIZED.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def lru_size(name: str) -> int | None:
    """The cache size ``C`` of a statistic named ``lru@C``, else ``None``."""
    sz = sized_stat(name)
    return sz[1] if sz is not None and sz[0] == "lru" else None


def top_size(name: str) -> int | None:
    """The number of experts ``C`` of a statistic named ``top@C``, else ``None``."""
    sz = sized_stat(name)
    return sz[1] if sz is not None and sz[0] == "top" else None


def is_stat(name: str) -> bool:
    """Whether ``name`` is a statistic a fit can target (:data:`STAT_NAMES`)."""
    return (name in STAT_NAMES and "@C" not in name) or sized_stat(name) is not None


@dataclass(frozen=True)
class TargetEntry:
    """One entry of a targets file: the value, where it comes from, how a published metric
    was mapped onto moesim's (empty when it is the same statistic) and the tolerance."""

    value: TargetValue
    source: str
    metric: str = ""
    tolerance: float = DEFAULT_TOLERANCE


def profile_values(profile: tuple[float, ...], num_layers: int) -> tuple[float, ...]:
    """A per-layer profile stretched over ``num_layers`` layers by linear interpolation in
    relative depth (one value: every layer)."""
    if len(profile) == num_layers:
        return tuple(float(x) for x in profile)
    if len(profile) == 1 or num_layers == 1:
        return (float(profile[0]),) * num_layers
    xs = np.interp(np.linspace(0.0, 1.0, num_layers), np.linspace(0.0, 1.0, len(profile)), profile)
    return tuple(float(x) for x in xs)


class FitTargetError(MoesimError, ValueError):
    """A target that cannot be used; one line naming it."""


@dataclass(frozen=True)
class FitTarget:
    """The statistics a fit matches, with the shape and workload they came from. ``reuse`` is
    per layer (empty: no reuse target), ``recall`` maps measure names to overall recall,
    ``sources`` statistic names to where the value comes from, ``profile_share`` the share of
    requests the recall's profile split held."""

    model: str
    num_layers: int
    num_experts: int
    top_k: int
    reuse: tuple[float, ...]  # per layer, share of the top-k shared with the previous token
    entropy: float | None  # mean over layers of popularity entropy / log E
    next_layer_acc: float | None  # pooled over layers; None without lookahead logits
    requests: int = 8
    prompt_len: int = 64
    decode_len: int = 64
    recall: dict[str, float] = field(default_factory=dict)
    lru: dict[int, float] = field(default_factory=dict)  # cache size -> LRU hit rate
    top: dict[int, float] = field(default_factory=dict)  # C -> share of the C most popular experts
    sources: dict[str, str] = field(default_factory=dict)
    profile_share: float | None = None
    vocab_size: int | None = None  # token ids seen, when the trace has token_id
    zipf_s: float | None = None  # their Zipf exponent (:func:`zipf_fit`)
    token_repeat: float | None = None  # share of tokens repeating the previous one, beyond Zipf's chance

    @classmethod
    def from_stats(cls, st: TraceStats, recall: RecallStats | None = None,
                   tokens: tuple[np.ndarray, np.ndarray] | None = None) -> FitTarget:
        """The target of a trace's :class:`traces.stats.TraceStats` (and, when given, its
        prediction recall and the vocabulary of its ``tokens``: ``(token_id, request_id)``,
        one per token, see :func:`token_fit`). Its workload is the mean prompt and decode
        tokens per request."""
        m = st.meta.model
        if any(x.reuse is None for x in st.layers):
            raise MoesimError(f"{st.path}: no token has a previous token in its request; reuse is undefined")
        req = max(1, st.requests)
        rec = {k: float(v) for k, v in recall.overall.items() if v is not None} if recall is not None else {}
        share = recall.profile_requests / req if recall is not None and recall.profile_requests else None
        vocab, s, rep = token_fit(*tokens) if tokens is not None and len(tokens[0]) else (None, None, None)
        return cls(
            model=m.name, num_layers=m.num_layers, num_experts=m.num_experts, top_k=m.top_k,
            reuse=tuple(float(x.reuse) for x in st.layers if x.reuse is not None),
            entropy=float(st.overall.entropy), next_layer_acc=st.overall.next_layer_acc,
            requests=req, prompt_len=round(st.tokens_by_phase.get("prefill", 0) / req),
            decode_len=round(st.tokens_by_phase.get("decode", 0) / req), recall=rec,
            sources={k: str(st.path) for k in (*TRACE_STATS, *rec)}, profile_share=share,
            vocab_size=vocab, zipf_s=s, token_repeat=rep,
        )

    def value(self, name: str) -> float | None:
        """The target of statistic ``name`` (``reuse``: the mean over layers), or ``None``."""
        if name == "reuse":
            return float(sum(self.reuse) / len(self.reuse)) if self.reuse else None
        if name in ("entropy", "next_layer_acc"):
            return getattr(self, name)
        sized = sized_stat(name)
        if sized is not None:
            return (self.lru if sized[0] == "lru" else self.top).get(sized[1])
        return self.recall.get(name)

    def with_values(self, values: Mapping[str, TargetValue], sources: Mapping[str, str]) -> FitTarget:
        """This target with the statistics of ``values`` replaced (``reuse``: a number is every
        layer's, a list a per-layer profile, see :func:`profile_values`)."""
        recall, lru, top = dict(self.recall), dict(self.lru), dict(self.top)
        upd: dict[str, Any] = {"sources": {**self.sources, **sources}}
        for k, v in values.items():
            if isinstance(v, tuple):
                if k != "reuse":
                    raise FitTargetError(f"target {k}: a list is only allowed for reuse (a per-layer profile)")
                upd["reuse"] = profile_values(v, self.num_layers)
                continue
            sized = sized_stat(k)
            if sized is not None:
                if sized[1] > self.num_experts:
                    raise FitTargetError(f"target {k}: {sized[1]} is more than the {self.num_experts} experts of "
                                         "a layer")
                (lru if sized[0] == "lru" else top)[sized[1]] = float(v)
            elif k == "reuse":
                upd["reuse"] = (float(v),) * self.num_layers
            elif k in ("entropy", "next_layer_acc"):
                upd[k] = float(v)
            elif k in MEASURES:
                recall[k] = float(v)
        upd.update(recall=recall, lru=lru, top=top)
        return replace(self, **upd)


def token_fit(token_ids: np.ndarray, request_ids: np.ndarray) -> tuple[int, float, float]:
    """``(vocab_size, zipf_s, token_repeat)`` of a token stream for the generator's token
    component: the number of distinct ids; the maximum-likelihood exponent of a Zipf law over
    that many ranks given the ids' rank-frequency counts (``E_s[log rank]`` equals the observed
    mean log rank; bisection, as it falls with ``s``); and the repeat probability ``r`` that
    gives the observed share ``m`` of tokens equal to the previous token of their request:
    ``m = r + (1 - r) * sum(p^2)`` over the Zipf law (repeats keep its frequencies)."""
    token_ids, request_ids = np.asarray(token_ids), np.asarray(request_ids)
    counts = np.bincount(np.unique(token_ids, return_inverse=True)[1])
    counts = np.sort(counts)[::-1].astype(np.float64)
    V = int(counts.size)
    logr = np.log(np.arange(1, V + 1, dtype=np.float64))
    want = float((counts * logr).sum() / counts.sum())

    def mean_logr(s: float) -> float:
        w = np.exp(-s * logr)
        return float((w * logr).sum() / w.sum())

    lo, hi = 0.0, 4.0
    if V < 2 or want >= mean_logr(0.0):
        s = 0.0
    else:
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mean_logr(mid) > want else (lo, mid)
        s = 0.5 * (lo + hi)
    cont = request_ids[1:] == request_ids[:-1]
    m = float((token_ids[1:] == token_ids[:-1])[cont].mean()) if cont.any() else 0.0
    w = np.exp(-s * logr)
    q = float(((w / w.sum()) ** 2).sum())
    rep = 0.0 if q >= 1.0 else min(0.99, max(0.0, (m - q) / (1.0 - q)))
    return V, s, rep


_ENTRY_KEYS = ("value", "source", "metric", "tolerance")


def _unit(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or not 0.0 <= raw <= 1.0:
        raise FitTargetError(f"{where}: {raw!r} is not a number in 0..1")
    return float(raw)


def parse_target_entries(data: Any, origin: str) -> dict[str, TargetEntry]:
    """Check a mapping of targets (see the module docstring); returns one
    :class:`TargetEntry` per statistic. ``origin`` names where it came from in messages and
    is the source of values given bare."""
    if not isinstance(data, Mapping) or not data:
        raise FitTargetError(f"{origin}: expected a mapping of statistic: value (statistics: {', '.join(STAT_NAMES)})")
    out: dict[str, TargetEntry] = {}
    for name, raw in data.items():
        if not isinstance(name, str) or not is_stat(name):
            raise FitTargetError(f"{origin}: {name!r} is not a statistic (known: {', '.join(STAT_NAMES)})")
        src, metric, tol = origin, "", DEFAULT_TOLERANCE
        if isinstance(raw, Mapping):
            extra = set(raw) - set(_ENTRY_KEYS)
            if "value" not in raw or extra:
                raise FitTargetError(f"{origin}: {name}: expected a number or {{value: NUMBER, source: TEXT, "
                                     f"metric: TEXT, tolerance: NUMBER}}" + (f" (unknown: {sorted(map(str, extra))})"
                                                                            if extra else ""))
            for key in ("source", "metric"):
                if key in raw and (not isinstance(raw[key], str) or not raw[key].strip()):
                    raise FitTargetError(f"{origin}: {name}: {key} must be non-empty text")
            src = str(raw.get("source", origin))
            metric = str(raw.get("metric", ""))
            if "tolerance" in raw:
                tol = _unit(raw["tolerance"], f"{origin}: {name}: tolerance")
            raw = raw["value"]
        value: TargetValue
        if isinstance(raw, list):
            if name != "reuse" or not raw:
                raise FitTargetError(f"{origin}: {name}: a list is only allowed for reuse (a per-layer profile, "
                                     "at least one value)")
            value = tuple(_unit(x, f"{origin}: {name}") for x in raw)
        else:
            value = _unit(raw, f"{origin}: {name}")
        out[name] = TargetEntry(value=value, source=src, metric=metric, tolerance=tol)
    return out


def parse_targets(data: Any, origin: str) -> tuple[dict[str, TargetValue], dict[str, str]]:
    """:func:`parse_target_entries` as ``(values, sources)``."""
    entries = parse_target_entries(data, origin)
    return {k: e.value for k, e in entries.items()}, {k: e.source for k, e in entries.items()}


def load_target_entries(path: str | os.PathLike[str]) -> dict[str, TargetEntry]:
    """:func:`parse_target_entries` of a YAML file."""
    if not os.path.isfile(path):
        raise FitTargetError(f"--targets {str(path)!r}: no such file")
    return parse_target_entries(load_yaml_file(Path(path)), str(path))


def load_targets(path: str | os.PathLike[str]) -> tuple[dict[str, TargetValue], dict[str, str]]:
    """:func:`parse_targets` of a YAML file."""
    entries = load_target_entries(path)
    return {k: e.value for k, e in entries.items()}, {k: e.source for k, e in entries.items()}
