"""What ``simctl trace fit`` aims at: the statistics of a recorded trace, or values given by
hand (a YAML file or ``--target NAME=VALUE``), each optionally with its source.

Statistic names: ``reuse`` (token-to-token reuse, per layer from a trace or one value for all
layers), ``entropy`` (mean popularity entropy / log E) and ``next_layer_acc`` (lookahead
accuracy over all tokens), as ``simctl trace stats`` defines them, and the prediction-recall
measures of :mod:`traces.analysis.recall` (``lookahead``, ``transition@1..3``,
``previous_token``, ``same_token``, ``popularity``, ``semantic``, ``trajectory@1..3``),
measured on the decode tokens of the requests outside the profile split.

A targets file is a mapping from statistic to either a number or ``{value: NUMBER, source:
TEXT}``; the sources are printed beside target and achieved::

    lookahead: {value: 0.62, source: "recorded tiny MoE, moesim issue 22"}
    previous_token: 0.44
"""

from __future__ import annotations

import math
import os
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
STAT_NAMES = (*TRACE_STATS, *MEASURES)
"""Every statistic a fit can target."""


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
        return self.recall.get(name)

    def with_values(self, values: Mapping[str, float], sources: Mapping[str, str]) -> FitTarget:
        """This target with the statistics of ``values`` replaced (``reuse``: every layer)."""
        upd: dict[str, Any] = {"recall": {**self.recall, **{k: v for k, v in values.items() if k in MEASURES}},
                               "sources": {**self.sources, **sources}}
        if "reuse" in values:
            upd["reuse"] = (float(values["reuse"]),) * self.num_layers
        for k in ("entropy", "next_layer_acc"):
            if k in values:
                upd[k] = float(values[k])
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


def parse_targets(data: Any, origin: str) -> tuple[dict[str, float], dict[str, str]]:
    """Check a mapping of targets (see the module docstring); returns ``(values, sources)``.
    ``origin`` names where it came from in messages and is the source of values given bare."""
    if not isinstance(data, Mapping) or not data:
        raise FitTargetError(f"{origin}: expected a mapping of statistic: value (statistics: {', '.join(STAT_NAMES)})")
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for name, raw in data.items():
        if name not in STAT_NAMES:
            raise FitTargetError(f"{origin}: {name!r} is not a statistic (known: {', '.join(STAT_NAMES)})")
        src = origin
        if isinstance(raw, Mapping):
            extra = set(raw) - {"value", "source"}
            if "value" not in raw or extra:
                raise FitTargetError(f"{origin}: {name}: expected a number or {{value: NUMBER, source: TEXT}}")
            src = str(raw.get("source", origin))
            raw = raw["value"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
                or not 0.0 <= raw <= 1.0:
            raise FitTargetError(f"{origin}: {name}: {raw!r} is not a number in 0..1")
        values[name], sources[name] = float(raw), src
    return values, sources


def load_targets(path: str | os.PathLike[str]) -> tuple[dict[str, float], dict[str, str]]:
    """:func:`parse_targets` of a YAML file."""
    if not os.path.isfile(path):
        raise FitTargetError(f"--targets {str(path)!r}: no such file")
    return parse_targets(load_yaml_file(Path(path)), str(path))
