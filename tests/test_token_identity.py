"""The generator's token-identity component and lookahead quality (traces/synthetic/generator.py):
knobs at their defaults route exactly as before they existed, a token routes like its earlier
occurrences, the token stream's Zipf law and runs, the lookahead knob, and parameter errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from moesim.traces.analysis.recall import recall_stats, routing_arrays
from moesim.traces.synthetic.fit_targets import token_fit
from moesim.traces.synthetic.generator import SynthError, generate, parse_params
from moesim.traces.synthetic.tokens import hashed_normals, token_stream

SMALL = {"model": "mixtral-8x7b", "num_layers": 3, "num_experts": 8, "top_k": 2, "requests": 3, "prompt_len": 5,
         "decode_len": 7, "length_jitter": 0.4, "token_locality": [0.2, 0.7], "topic_strength": 0.3,
         "latent_dim": 8, "embedding_dim": 4, "seed": 11}
# sha256 of these columns of SMALL as generator version 1 (before the token component) wrote them
V1_DIGEST = "c1d404d111a53edb4609596b0989d12cfdaca2026e8218c0c7e2da3d8eead9ee"
V1_COLUMNS = ("request_id", "token_idx", "phase", "layer", "experts", "weights", "logits", "lookahead_logits",
              "embedding", "embedding_rows")


def digest(cols: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in V1_COLUMNS:
        h.update(np.ascontiguousarray(cols[k]).tobytes())
    return h.hexdigest()


def test_new_knobs_off_give_version_1_output() -> None:
    cols, meta = generate(parse_params(SMALL))
    assert digest(cols) == V1_DIGEST and "token_id" not in cols
    assert meta.source["params"]["token_strength"] == 0.0
    # the token stream's own knobs change nothing while the component is off
    cols, _ = generate(parse_params({**SMALL, "vocab_size": 7, "zipf_s": 2.5, "token_repeat": 0.5}))
    assert digest(cols) == V1_DIGEST


def _same_token_overlap(cols: dict[str, np.ndarray], L: int, k: int) -> float:
    """Mean overlap / k of a token's experts with those of the latest earlier token of the same
    id in another request (every layer)."""
    ex = cols["experts"].reshape(-1, L, k)
    tok, req = cols["token_id"][::L], cols["request_id"][::L]
    last: dict[int, int] = {}
    hits = n = 0
    for i, w in enumerate(tok.tolist()):
        j = last.get(w)
        if j is not None and req[j] != req[i]:
            hits += sum(len(set(ex[i, lay]) & set(ex[j, lay])) for lay in range(L))
            n += L
        last[w] = i
    return hits / (n * k)


def test_a_token_routes_like_its_earlier_occurrences() -> None:
    base = {"model": "mixtral-8x7b", "num_layers": 4, "num_experts": 16, "top_k": 2, "requests": 6,
            "prompt_len": 0, "decode_len": 150, "vocab_size": 200, "topic_strength": 0.2, "token_locality": 0.0,
            "popularity_skew": 0.0, "latent_dim": 16, "seed": 2}
    strong = _same_token_overlap(generate(parse_params({**base, "token_strength": 0.95}))[0], 4, 2)
    weak = _same_token_overlap(generate(parse_params({**base, "token_strength": 0.3}))[0], 4, 2)
    assert strong > 0.6 and weak < 0.25  # chance: 2 / 16
    # and the recall measures see it: same-token and trajectory matching beat chance by far
    cols, meta = generate(parse_params({**base, "token_strength": 0.95}))
    rec = recall_stats(routing_arrays(cols, meta.model))
    assert rec.overall["same_token"] == pytest.approx(strong, abs=0.05)
    assert rec.overall["trajectory@1"] > 0.55 and rec.overall["previous_token"] < 0.25


def test_token_vectors_are_fixed_per_id_and_layer() -> None:
    a = hashed_normals(9, np.array([3, 17, 40]), 2, 5)
    b = hashed_normals(9, np.array([40, 3]), 2, 5)
    np.testing.assert_array_equal(a[[2, 0]], b)
    assert not np.array_equal(hashed_normals(9, np.array([3]), 3, 5), a[:1])
    assert not np.array_equal(hashed_normals(8, np.array([3]), 2, 5), a[:1])
    z = hashed_normals(1, np.arange(4000), 0, 16).ravel()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02


def test_token_stream_zipf_and_runs() -> None:
    pos = np.tile(np.arange(400), 50)
    w = token_stream(np.random.default_rng(0), pos, 500, 1.1)
    counts = np.bincount(w, minlength=500)
    assert counts[0] == counts.max() and counts[0] / counts[9] == pytest.approx(10**1.1, rel=0.2)
    vocab, s, rep = token_fit(w, np.repeat(np.arange(50), 400))
    assert vocab <= 500 and s == pytest.approx(1.1, abs=0.08) and rep == pytest.approx(0.0, abs=0.02)
    runs = token_stream(np.random.default_rng(0), pos, 500, 1.1, repeat=0.4)
    assert not (runs[1:] == runs[:-1])[pos[1:] == 0].all()  # a request never starts by repeating
    assert token_fit(runs, np.repeat(np.arange(50), 400))[2] == pytest.approx(0.4, abs=0.03)


def test_lookahead_quality() -> None:
    base = {**SMALL, "requests": 4, "prompt_len": 0, "decode_len": 200, "length_jitter": 0.0,
            "layer_correlation": 0.95}
    recall = {}
    for q in (1.0, 0.5, 0.0):
        cols, meta = generate(parse_params({**base, "lookahead_quality": q}))
        recall[q] = recall_stats(routing_arrays(cols, meta.model)).overall["lookahead"]
        if q < 1.0:  # the routing itself does not change
            np.testing.assert_array_equal(cols["experts"], generate(parse_params(base))[0]["experts"])
    assert recall[1.0] > recall[0.5] + 0.1 and recall[0.0] == pytest.approx(2 / 8, abs=0.08)


@pytest.mark.parametrize(("data", "words"), [
    ({"token_strength": 0.9, "topic_strength": 0.5}, "synthetic: token_strength 0.9 with topic_strength 0.5"),
    ({"token_strength": 1.5}, "synthetic.token_strength: Input should be less than or equal to 1"),
    ({"vocab_size": 0}, "synthetic.vocab_size: Input should be greater than or equal to 1"),
    ({"lookahead_quality": -0.1}, "synthetic.lookahead_quality: Input should be greater than or equal to 0"),
    ({"token_repeat": 1.0}, "synthetic.token_repeat: Input should be less than or equal to 0.99"),
])
def test_errors(data: dict[str, float], words: str) -> None:
    with pytest.raises(SynthError, match=words.replace("^", r"\^")):
        parse_params(data)
