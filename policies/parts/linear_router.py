"""A linear next-router: multinomial logistic regression from one layer's router logits to the
next router's probability distribution, fitted with numpy by minimising the KL divergence of
CommitMoE's Eq. (4), ``D_KL(softmax(R_true) || softmax(R_pred))``.

The paper's "Commit Router" is a single linear layer on the router's hidden state ``h^(i)``
(two layers for the cross-token case). A trace holds no hidden states, so the features here are
the layer's own router logits (``E`` numbers, a linear projection of ``h^(i)``), centred per row
(softmax ignores a shift) and standardised with the training rows' mean and spread. Training is
the paper's recipe scaled to a small offline split (section 5.1): an 80/20 split drawn with
seed 42, full-batch Adam, early stopping on the validation loss (the best validation weights are
kept). The learning rate and epoch count are ours: the paper's 5e-5 is for millions of
mini-batch steps, not a few hundred full-batch ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPLIT_SEED = 42
"""Seed of the train/validation split (CommitMoE section 5.1)."""
VAL_FRACTION = 0.2
"""Share of the rows held out for early stopping (CommitMoE section 5.1: 80/20)."""


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def kl_rows(p: np.ndarray, q: np.ndarray) -> float:
    """Mean over rows of ``D_KL(p || q)`` (nats) for ``[n, E]`` distributions."""
    eps = 1e-12
    return float(np.mean(np.sum(p * (np.log(p + eps) - np.log(q + eps)), axis=1)))


@dataclass(frozen=True)
class LinearRouter:
    """A fitted map ``[n, E_in]`` logits -> ``[n, E_out]`` probabilities. ``train_kl`` and
    ``val_kl`` are the mean KL divergences (nats) of the kept weights; ``epochs`` how many ran."""

    weight: np.ndarray   # [E_in, E_out]
    bias: np.ndarray     # [E_out]
    mean: np.ndarray     # [E_in] feature centre
    scale: np.ndarray    # [E_in] feature spread (>0)
    train_kl: float
    val_kl: float
    epochs: int
    rows: int

    def features(self, logits: np.ndarray) -> np.ndarray:
        """Row-centred, standardised features of ``[n, E_in]`` logits."""
        x = np.asarray(logits, dtype=np.float64)
        x = x - x.mean(axis=1, keepdims=True)
        out: np.ndarray = (x - self.mean) / self.scale
        return out

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """``[n, E_out]`` predicted next-router probabilities."""
        return _softmax(self.features(logits) @ self.weight + self.bias)


def fit_linear_router(logits: np.ndarray, target: np.ndarray, *, lr: float, epochs: int,
                      patience: int) -> LinearRouter:
    """Fit on ``logits`` ``[n, E_in]`` against target distributions ``target`` ``[n, E_out]``
    (rows summing to 1). At least 2 rows; with fewer than 5 the training rows double as the
    validation rows."""
    x_raw = np.asarray(logits, dtype=np.float64)
    p = np.asarray(target, dtype=np.float64)
    n = x_raw.shape[0]
    if n < 2:
        raise ValueError(f"a linear router needs at least 2 training rows, got {n}")
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_val = int(round(VAL_FRACTION * n)) if n >= 5 else 0
    val, tr = (perm[:n_val], perm[n_val:]) if n_val else (perm, perm)
    xc = x_raw - x_raw.mean(axis=1, keepdims=True)
    mean = xc[tr].mean(axis=0)
    scale = xc[tr].std(axis=0)
    scale = np.where(scale > 1e-8, scale, 1.0)
    x = (xc - mean) / scale
    e_in, e_out = x.shape[1], p.shape[1]
    w = np.zeros((e_in, e_out))
    b = np.log(p[tr].mean(axis=0) + 1e-9)       # start from the marginal distribution
    b -= b.mean()
    m_w, v_w, m_b, v_b = np.zeros_like(w), np.zeros_like(w), np.zeros_like(b), np.zeros_like(b)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    best = (kl_rows(p[val], _softmax(x[val] @ w + b)), w.copy(), b.copy())
    since, ran = 0, 0
    xt, pt = x[tr], p[tr]
    for step in range(1, epochs + 1):
        ran = step
        q = _softmax(xt @ w + b)
        g = (q - pt) / len(tr)                  # d KL / d pre-softmax scores
        gw, gb = xt.T @ g, g.sum(axis=0)
        m_w = beta1 * m_w + (1 - beta1) * gw
        v_w = beta2 * v_w + (1 - beta2) * gw * gw
        m_b = beta1 * m_b + (1 - beta1) * gb
        v_b = beta2 * v_b + (1 - beta2) * gb * gb
        c1, c2 = 1 - beta1 ** step, 1 - beta2 ** step
        w -= lr * (m_w / c1) / (np.sqrt(v_w / c2) + eps)
        b -= lr * (m_b / c1) / (np.sqrt(v_b / c2) + eps)
        loss = kl_rows(p[val], _softmax(x[val] @ w + b))
        if loss < best[0] - 1e-9:
            best, since = (loss, w.copy(), b.copy()), 0
        else:
            since += 1
            if since >= patience:
                break
    _, w, b = best
    return LinearRouter(weight=w, bias=b, mean=mean, scale=scale,
                        train_kl=kl_rows(pt, _softmax(xt @ w + b)), val_kl=best[0], epochs=ran, rows=n)
