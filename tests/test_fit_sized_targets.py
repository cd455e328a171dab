"""``lru@C`` and ``top@C`` targets of ``simctl trace fit`` and per-layer reuse profiles:
parsing, the fit's measurement against ``simctl trace stats``, and the knobs they drive."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from moesim.sim.core.errors import MoesimError
from moesim.traces.analysis.stats import trace_stats
from moesim.traces.synthetic.fit import _drivers, fit, measure
from moesim.traces.synthetic.fit_targets import (
    FitTarget,
    parse_target_entries,
    parse_targets,
    profile_values,
)
from moesim.traces.synthetic.generator import parse_params, synthesize

SMALL = {"model": "olmoe-1b-7b", "num_layers": 3, "requests": 3, "prompt_len": 8, "decode_len": 24,
         "popularity_skew": 0.5, "token_locality": 0.6, "seed": 3}


def _target(**values: object) -> FitTarget:
    base = FitTarget(model="olmoe-1b-7b", num_layers=3, num_experts=64, top_k=8, reuse=(), entropy=None,
                     next_layer_acc=None, requests=3, prompt_len=8, decode_len=24)
    vals, srcs = parse_targets(values, "test")
    return base.with_values(vals, srcs)


def test_entries_parse_with_metric_tolerance_and_profiles() -> None:
    entries = parse_target_entries({
        "lru@16": {"value": 0.5, "source": "paper, Table 1", "metric": "as is", "tolerance": 0.02},
        "top@4": 0.3, "reuse": {"value": [0.2, 0.4], "source": "s"}}, "f.yaml")
    assert entries["lru@16"].tolerance == 0.02 and entries["lru@16"].metric == "as is"
    assert entries["top@4"].source == "f.yaml" and entries["top@4"].tolerance == 0.03
    assert entries["reuse"].value == (0.2, 0.4)
    t = _target(reuse=[0.2, 0.4], **{"lru@16": 0.5, "top@4": 0.3})
    assert t.reuse == pytest.approx((0.2, 0.3, 0.4)) and t.value("lru@16") == 0.5 and t.value("top@4") == 0.3
    assert profile_values((0.1,), 4) == (0.1,) * 4


@pytest.mark.parametrize(("data", "words"), [
    ({"lru@0": 0.5}, "'lru@0' is not a statistic"),
    ({"lru@x": 0.5}, "'lru@x' is not a statistic"),
    ({"lookahead": [0.5, 0.6]}, "lookahead: a list is only allowed for reuse"),
    ({"lookahead": {"value": 0.5, "cite": "x"}}, "(unknown: ['cite'])"),
    ({"lookahead": {"value": 0.5, "tolerance": 2}}, "lookahead: tolerance: 2 is not a number in 0..1"),
    ({"lookahead": {"value": 0.5, "source": ""}}, "lookahead: source must be non-empty text"),
])
def test_bad_entries_name_the_culprit(data: dict[str, object], words: str) -> None:
    with pytest.raises(MoesimError, match=None) as err:
        parse_target_entries(data, "f.yaml")
    assert words in str(err.value) and str(err.value).startswith("f.yaml: ")


def test_lru_size_above_the_experts_is_refused() -> None:
    with pytest.raises(MoesimError, match="lru@65: 65 is more than the 64 experts"):
        _target(**{"lru@65": 0.9})


def test_measured_lru_and_top_equal_trace_stats(tmp_path: Path) -> None:
    params = parse_params(SMALL)
    path, _, _ = synthesize(params, tmp_path / "t.parquet")
    st = trace_stats(path, cache_sizes=[8, 16])
    got = measure(params, lru_sizes=(8, 16), top_sizes=(7,))
    for c in (8, 16):
        assert got.lru[c] == pytest.approx(st.overall.lru[c], abs=1e-12)
    assert got.top[7] == pytest.approx(got.top10_share)  # ceil(64 / 10) = 7 experts
    assert math.isclose(got.top10_share, float(np.mean([x.top10_share for x in st.layers])), abs_tol=1e-9)


def test_lru_and_top_targets_drive_locality_and_skew() -> None:
    drive, held = _drivers(_target(**{"lru@16": 0.5, "top@7": 0.3}), {"token_locality", "popularity_skew",
                                                                       "topic_strength"})
    assert drive == {"token_locality": "lru@16", "topic_strength": "lru@16", "popularity_skew": "top@7"}
    drive, _ = _drivers(_target(previous_token=0.3, **{"lru@16": 0.5}), {"token_locality"})
    assert drive["token_locality"] == "previous_token"  # reuse-like statistics come first


def test_fit_meets_an_lru_target() -> None:
    """A trace made with known knobs: fitting its LRU@16 alone finds a locality that gives it."""
    truth = measure(parse_params(SMALL), lru_sizes=(16,)).lru[16]
    res = fit(_target(**{"lru@16": truth}), base={k: v for k, v in SMALL.items() if k != "token_locality"},
              knobs=["token_locality"], seed=3)
    assert abs(res.achieved.lru[16] - truth) < 0.02
    assert ("lru@16", truth, res.achieved.lru[16]) in res.rows()
