"""Predictors of a coming layer's routing, shared by every prefetcher.

A predictor answers, after layer ``l`` is routed, which experts the *next* step will use: layer
``l + 1`` of this iteration, or layer 0 of the next iteration after the last layer. It returns
``(expert, score)`` pairs, best first. Three sources:

* :class:`LookaheadPredictor`: the trace's ``lookahead_logits`` (router ``l + 1`` applied to
  layer ``l``'s hidden state, the speculative gate of Mixtral-offloading, Pre-gated MoE, MoEpic);
* :class:`PreviousTokenPredictor`: the previous iteration's routing of the target layer;
* :class:`OraclePredictor`: the recorded future (oracle policies only, a bound);
* :class:`TrainedPredictor`: a per-layer linear map from layer ``l``'s router logits to the next
  step's router distribution, fitted in ``setup`` on the profiling split only (CommitMoE's
  trained "Commit Router", Eq. 4, with router logits standing in for the hidden state).

:meth:`Predictor.token_scores` gives each token's own ``[n, E]`` scores (for a planner that
commits per token); :meth:`Predictor.predict` the union a prefetcher issues.
"""

from __future__ import annotations

import numpy as np

from moesim.policies.contract.base import Context, PolicySetupError, Profile, View
from moesim.policies.parts.kernel import DeclaresKernel
from moesim.policies.parts.linear_router import LinearRouter, fit_linear_router

PREDICTORS = ("auto", "lookahead", "previous-token", "trained")

_F32 = np.dtype(np.float32)
_INF = float("inf")
_max, _sum = np.maximum.reduce, np.add.reduce   # what ndarray.max / .sum reduce with


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[n, E]`` scores, in their float type (at least float32), computed in
    place on one copy. One row (the batch-1 case, once per layer) takes 1-D reductions: a row's
    maximum and its pairwise sum are the same numbers as along ``axis=1``, without the 2-D
    reduction's set-up. The reductions are the ufuncs' own (``ndarray.max`` and ``.sum`` call
    them through a Python wrapper, with the same arguments)."""
    if type(x) is np.ndarray and x.dtype.char in "ef":   # float16/32: float32, as result_type gives
        z = x.astype(_F32)   # a copy in x's layout, as np.array(x, dtype=float32) makes
    else:
        z = np.array(x, dtype=np.result_type(np.asarray(x).dtype, _F32))
    if z.shape[0] == 1:
        row = z[0]
        row -= _max(row)
        np.exp(row, out=row)
        row /= _sum(row)
        return z
    z -= _max(z, axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= _sum(z, axis=1, keepdims=True)
    return z


def top_experts(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Union over tokens of each token's ``k`` best experts by ``scores`` (``[n, E]``), ordered by
    the best score any token gives them (descending, then expert id)."""
    if not (type(scores) is np.ndarray and len(scores) == 1 and scores.dtype.char in "ef"):
        if not (isinstance(scores, np.ndarray) and scores.shape[0] == 1 and scores.dtype.char in "ef"):
            # one row of float16 ('e') or float32 ('f') gives the same Python floats unconverted;
            # several rows are converted, as argpartition's order among ties depends on the dtype
            scores = np.asarray(scores, dtype=np.float32)
        if scores.shape[0] != 1:
            return _top_experts_rows(scores, min(k, scores.shape[1]))
    # the common batch-1 case: plain Python beats numpy on one row
    row = scores.tolist()[0]   # its one row, without a row view
    k = min(k, len(row))
    if k == 2:
        # the sort below, by two maxima: max keeps the first of equal scores and index finds
        # it, as the stable sort puts the lower id first. Not with a NaN (its comparisons
        # order nothing) nor when the runner-up is -inf (index could find the marked best):
        # the sort decides those
        total = sum(row)   # NaN when a score is NaN (or +inf meets -inf)
        if total == total:
            m0 = max(row)
            e0 = row.index(m0)
            row[e0] = -_INF
            m1 = max(row)
            if m1 != -_INF:
                return [(e0, m0), (row.index(m1), m1)]
            row[e0] = m0
    # sorted(..., reverse=True)[:k] is what heapq.nlargest is defined as (ties keep index
    # order) and is faster on a router's few dozen scores
    out = []   # a plain loop: a comprehension is a call of its own, and k is small
    for e in sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]:
        out.append((e, row[e]))
    return out


def _top_experts_rows(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """:func:`top_experts` of several rows of float32 ``scores`` (``k`` at most their width)."""
    best: dict[int, float] = {}
    idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    for t in range(scores.shape[0]):
        for e in idx[t]:
            v = float(scores[t, e])
            if v > best.get(int(e), -np.inf):
                best[int(e)] = v
    return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))


class Predictor(DeclaresKernel):
    """Base of the predictors: :meth:`predict` after ``layer`` is routed, for the next step.
    ``probabilistic``: :meth:`token_scores` are probabilities (rows summing to 1), usable as
    combination weights; otherwise only their order means something. A predictor whose guesses
    the fast path's next-layer kernel reproduces names its source as ``kernel``
    (:mod:`moesim.policies.parts.kernel`)."""

    probabilistic = True

    def required_columns(self) -> frozenset[str]:
        """Trace columns the predictor cannot work without."""
        return frozenset()

    def read_columns(self) -> frozenset[str]:
        """Trace columns the predictor reads when present."""
        return self.required_columns()

    def setup(self, ctx: Context) -> None:
        """Once before the run."""

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """The experts of the step after (``layer``, this iteration), best first; ``k`` per token.
        Default: the union of each token's ``k`` best :meth:`token_scores`."""
        scores = self.token_scores(view, layer)
        return [] if scores is None else top_experts(scores, k)

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """``[n_tokens, E]`` scores (higher = likelier; probabilities where the source has them)
        of each token's next step after (``layer``, this iteration), or None when the source
        has no per-token answer. Rows are the tokens of this iteration, or of the previous one
        where :meth:`rows_from_previous_iteration` says so."""
        raise NotImplementedError

    def rows_from_previous_iteration(self, layer: int, num_layers: int) -> bool:
        """Whether :meth:`token_scores` after ``layer`` has one row per token of the previous
        iteration (not of this one): a per-request use of the rows must then match them by
        request. Default: False."""
        return False


class LookaheadPredictor(Predictor):
    """Each token's ``k`` best experts under the lookahead router (``lookahead_logits``)."""

    kernel = "lookahead"

    def required_columns(self) -> frozenset[str]:
        """Needs ``lookahead_logits``."""
        return frozenset({"lookahead_logits"})

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """Top-k of the lookahead logits of ``layer``."""
        logits = view.lookahead_logits(layer)
        assert logits is not None
        return top_experts(logits, k)

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """Softmax of each token's lookahead logits (the next router's probabilities):
        ``view.lookahead_probs``, read-only."""
        return view.lookahead_probs(layer)


class PreviousTokenPredictor(Predictor):
    """The previous iteration's routing of the target layer (after the last layer: this
    iteration's layer 0), ranked by router order."""

    kernel = "previous-token"
    probabilistic = False

    def setup(self, ctx: Context) -> None:
        """Remember the model's expert count."""
        self._E = ctx.num_experts

    def rows_from_previous_iteration(self, layer: int, num_layers: int) -> bool:
        """True before the last layer: the rows are the previous iteration's tokens."""
        return layer + 1 < num_layers

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """Rank scores (k for the previous token's first expert down to 1; 0 elsewhere): one
        row per token of the previous iteration (after the last layer: of this one)."""
        L = view.num_layers
        prev = view.previous_routing(layer + 1) if layer + 1 < L else view.routing(0).experts
        if prev is None:
            return None
        scores = np.zeros((prev.shape[0], self._E), dtype=np.float32)
        for t in range(prev.shape[0]):
            scores[t, prev[t]] = np.arange(prev.shape[1], 0, -1)
        return scores


class OraclePredictor(Predictor):
    """Exactly the experts the recorded routing uses at the next step (access order): a bound."""

    kernel = "oracle"
    probabilistic = False

    def setup(self, ctx: Context) -> None:
        """Take the oracle annotation."""
        if ctx.future is None:
            raise RuntimeError("the oracle predictor needs the oracle annotation (an oracle policy)")
        self._future = ctx.future

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """None: the oracle answers for the whole step, not per token."""
        return None

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
    the run's warnings. Its ``kernel``, ``auto``, stands for that of the source chosen at set-up
    (:attr:`inner`)."""

    kernel = "auto"

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
        # the chosen source answers directly (no forwarding frame per call)
        self.predict = self.inner.predict   # type: ignore[method-assign]
        self.token_scores = self.inner.token_scores   # type: ignore[method-assign]

    def predict(self, view: View, layer: int, k: int) -> list[tuple[int, float]]:
        """The chosen source's prediction."""
        return self.inner.predict(view, layer, k)

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """The chosen source's per-token scores."""
        return self.inner.token_scores(view, layer)

    def rows_from_previous_iteration(self, layer: int, num_layers: int) -> bool:
        """The chosen source's answer."""
        return self.inner.rows_from_previous_iteration(layer, num_layers)

    @property
    def probabilistic(self) -> bool:  # type: ignore[override]
        """Whether the chosen source's scores are probabilities."""
        return self.inner.probabilistic

    @property
    def source(self) -> str:
        """``lookahead`` or ``previous-token``: the source chosen at set-up."""
        return "lookahead" if isinstance(self.inner, LookaheadPredictor) else "previous-token"


class TrainedPredictor(Predictor):
    """CommitMoE's trained Commit Router, fitted in ``setup`` on the profiling split only (never
    on the replayed requests): one :class:`~moesim.policies.parts.linear_router.LinearRouter` per
    layer ``l``, mapping layer ``l``'s router logits (the ``logits`` column) to the router
    distribution of the next step, by the KL loss of Eq. (4).

    * same-token (``l < L-1``): target ``softmax(logits of layer l+1)`` of the same token, over
      every profile token (prefill and decode);
    * cross-token (``l = L-1``): target ``softmax(logits of layer 0)`` of the same request's next
      token, over the profile's pairs whose second token is a decode token.

    The paper's same-token predictor is one linear layer on the router's hidden state and its
    cross-token one a two-layer MLP (d -> 2d -> E); both are linear maps on router logits here
    (a trace holds no hidden states; the linear cross-token map is our simplification).
    ``lr``, ``epochs`` and ``patience`` are the Adam step, the epoch cap and the early-stopping
    patience (epochs without a better validation loss). At run time it reads ``view.logits(l)``,
    which is known once ``l`` is routed, so it predicts at the same moment as the lookahead gate.
    :attr:`fitted` reports each layer's rows and KL (for the run's outputs).
    """

    def __init__(self, *, lr: float = 0.05, epochs: int = 300, patience: int = 20) -> None:
        if lr <= 0 or epochs < 1 or patience < 1:
            raise PolicySetupError("the trained predictor needs lr > 0, epochs >= 1 and patience >= 1")
        self.lr = lr
        self.epochs = epochs
        self.patience = patience
        self.routers: list[LinearRouter] = []

    def required_columns(self) -> frozenset[str]:
        """Needs the full router ``logits`` (features and targets)."""
        return frozenset({"logits"})

    def setup(self, ctx: Context) -> None:
        """Fit one linear router per layer on ``ctx.profile``."""
        prof = ctx.profile
        if prof is None:
            raise PolicySetupError("predictor 'trained' is fitted on the profiling split: the "
                                   "scenario needs profile: {requests: N}")
        if prof.logits is None:
            raise PolicySetupError("predictor 'trained' needs router logits in the profile split")
        self.routers = self.fit(prof, lr=self.lr, epochs=self.epochs, patience=self.patience)

    @staticmethod
    def fit(prof: Profile, *, lr: float, epochs: int, patience: int) -> list[LinearRouter]:
        """The per-layer routers fitted on ``prof`` (see the class docstring)."""
        assert prof.logits is not None
        lg = prof.logits.astype(np.float64)                  # [N, L, E]
        N, L, _ = lg.shape
        routers = []
        for layer in range(L):
            if layer + 1 < L:
                x, y = lg[:, layer], lg[:, layer + 1]
            else:
                nxt = np.arange(N - 1)
                pair = (prof.request_id[1:] == prof.request_id[:-1]) & (prof.phase[1:] == 1)  # 1: decode (Profile.phase)
                x, y = lg[nxt[pair], layer], lg[nxt[pair] + 1, 0]
            if x.shape[0] < 2:
                raise PolicySetupError(f"predictor 'trained': the profile split has {x.shape[0]} "
                                       f"training row(s) for layer {layer}; give it more requests")
            routers.append(fit_linear_router(x, softmax_rows(y), lr=lr, epochs=epochs, patience=patience))
        return routers

    @property
    def fitted(self) -> list[dict[str, float]]:
        """Per layer: training rows, epochs run, train and validation KL (nats)."""
        return [{"rows": r.rows, "epochs": r.epochs, "train_kl": round(r.train_kl, 4),
                 "val_kl": round(r.val_kl, 4)} for r in self.routers]

    def token_scores(self, view: View, layer: int) -> np.ndarray | None:
        """Predicted next-router probabilities of each token from layer ``layer``'s logits."""
        logits = view.logits(layer)
        if logits is None or not self.routers:
            return None
        return self.routers[layer].probs(logits)


def make_predictor(name: str) -> Predictor:
    """A predictor by name: ``auto``, ``lookahead``, ``previous-token`` or ``trained`` (with
    :class:`TrainedPredictor`'s defaults)."""
    if name == "trained":
        return TrainedPredictor()
    if name == "auto":
        return AutoPredictor()
    if name == "lookahead":
        return LookaheadPredictor()
    if name == "previous-token":
        return PreviousTokenPredictor()
    raise PolicySetupError(f"predictor must be one of {', '.join(PREDICTORS)}, got {name!r}")
