"""Predictors of a coming layer's routing, shared by every prefetcher.

A predictor answers, after layer ``l`` is routed, which experts the *next* step will use: layer
``l + 1`` of this iteration, or layer 0 of the next iteration after the last layer. It returns
``(expert, score)`` pairs, best first. Three sources:

* :class:`LookaheadPredictor`: the trace's ``lookahead_logits`` (router ``l + 1`` applied to
  layer ``l``'s hidden state, the speculative gate of Mixtral-offloading, Pre-gated MoE, MoEpic);
* :class:`PreviousTokenPredictor`: the previous iteration's routing of the target layer;
* :class:`OraclePredictor`: the recorded future (oracle policies only, a bound).
"""

from __future__ import annotations

import heapq

import numpy as np

from moesim.policies.base import Context, PolicySetupError, View

PREDICTORS = ("auto", "lookahead", "previous-token")


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[n, E]`` scores, in their float type (at least float32)."""
    z = np.array(x, dtype=np.result_type(np.asarray(x).dtype, np.float32))
    z = z - z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def top_experts(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Union over tokens of each token's ``k`` best experts by ``scores`` (``[n, E]``), ordered by
    the best score any token gives them (descending, then expert id)."""
    scores = np.asarray(scores, dtype=np.float32)
    k = min(k, scores.shape[1])
    if scores.shape[0] == 1:  # the common batch-1 case: plain Python beats numpy on one row
        row = scores[0].tolist()
        return [(e, row[e]) for e in heapq.nlargest(k, range(len(row)), key=row.__getitem__)]
    best: dict[int, float] = {}
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    for t in range(scores.shape[0]):
        for e in idx[t]:
            v = float(scores[t, e])
            if v > best.get(int(e), -np.inf):
                best[int(e)] = v
    return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))


class Predictor:
    """Base of the predictors: :meth:`predict` after ``layer`` is routed, for the next step."""

    def required_columns(self) -> frozenset[str]:
        """Trace columns the predictor cannot work without."""
        return frozenset()

    def read_columns(self) -> frozenset[str]:
        """Trace columns the predictor reads when present."""
        return self.required_columns()

    def setup(self, ctx: Context) -> None:
        """Once before the run."""

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """The experts of the step after (``layer``, this iteration), best first; ``k`` per token."""
        raise NotImplementedError


class LookaheadPredictor(Predictor):
    """Each token's ``k`` best experts under the lookahead router (``lookahead_logits``)."""

    def required_columns(self) -> frozenset[str]:
        """Needs ``lookahead_logits``."""
        return frozenset({"lookahead_logits"})

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """Top-k of the lookahead logits of ``layer``."""
        logits = view.lookahead_logits(layer)
        assert logits is not None
        return top_experts(logits, k)


class PreviousTokenPredictor(Predictor):
    """The previous iteration's routing of the target layer (after the last layer: this
    iteration's layer 0), ranked by router order."""

    def setup(self, ctx: Context) -> None:
        """Remember the model's expert count."""
        self._E = ctx.num_experts

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """Experts the previous token used at the target layer."""
        L = view.num_layers
        prev = view.previous_routing(layer + 1) if layer + 1 < L else view.routing(0).experts
        if prev is None:
            return []
        scores = np.zeros((prev.shape[0], self._E), dtype=np.float32)
        for t in range(prev.shape[0]):
            scores[t, prev[t]] = np.arange(prev.shape[1], 0, -1)
        return top_experts(scores, k)


class OraclePredictor(Predictor):
    """Exactly the experts the recorded routing uses at the next step (access order): a bound."""

    def setup(self, ctx: Context) -> None:
        """Take the oracle annotation."""
        if ctx.future is None:
            raise RuntimeError("the oracle predictor needs the oracle annotation (an oracle policy)")
        self._future = ctx.future

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """The next step's recorded experts, ``k`` ignored."""
        L = view.num_layers
        it = view.iteration_index
        nxt_it, target = (it, layer + 1) if layer + 1 < L else (it + 1, 0)
        routing = self._future.routing(nxt_it, target).reshape(-1).tolist()
        order = list(dict.fromkeys(int(e) for e in routing))
        return [(e, float(-rank)) for rank, e in enumerate(order)]


class AutoPredictor(Predictor):
    """``lookahead`` when the trace has lookahead logits, else ``previous-token``, saying so in
    the run's warnings."""

    def __init__(self) -> None:
        self.inner: Predictor = LookaheadPredictor()

    def read_columns(self) -> frozenset[str]:
        """Reads ``lookahead_logits`` when present."""
        return frozenset({"lookahead_logits"})

    def setup(self, ctx: Context) -> None:
        """Pick the source the trace allows."""
        if ctx.has_lookahead:
            self.inner = LookaheadPredictor()
        else:
            self.inner = PreviousTokenPredictor()
            ctx.warn("the trace has no lookahead_logits: the prefetcher predicts from the previous "
                     "token's routing instead (predictor: auto)")
        self.inner.setup(ctx)

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """The chosen source's prediction."""
        return self.inner.predict(view, layer, k)


def make_predictor(name: str) -> Predictor:
    """A predictor by name: ``auto``, ``lookahead`` or ``previous-token``."""
    if name == "auto":
        return AutoPredictor()
    if name == "lookahead":
        return LookaheadPredictor()
    if name == "previous-token":
        return PreviousTokenPredictor()
    raise PolicySetupError(f"predictor must be one of {', '.join(PREDICTORS)}, got {name!r}")
