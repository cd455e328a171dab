"""``simctl trace fit`` aiming at prediction recall: the token and lookahead knobs move the
achieved recall onto a trace's, explicit targets with their sources, and target errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moesim.sim.cli.main import main
from moesim.traces.synthetic.fit import fit_trace, measure
from moesim.traces.synthetic.generator import SynthParams, synthesize

TRUTH = {"model": "mixtral-8x7b", "num_layers": 3, "num_experts": 8, "top_k": 2, "requests": 8, "prompt_len": 8,
         "decode_len": 40, "popularity_skew": 0.3, "layer_correlation": 0.9, "token_locality": 0.2,
         "topic_strength": 0.2, "token_strength": 0.9, "lookahead_quality": 0.5, "vocab_size": 100, "zipf_s": 1.0,
         "latent_dim": 8, "seed": 4}
SMALL_SET = ["--set", "model=mixtral-8x7b", "--set", "num_layers=3", "--set", "num_experts=8", "--set", "requests=6",
             "--set", "prompt_len=4", "--set", "decode_len=30", "--set", "latent_dim=8"]


def test_fit_moves_recall_onto_the_trace(tmp_path: Path) -> None:
    path, _, _ = synthesize(SynthParams(**TRUTH), tmp_path / "t.parquet")
    base = {**TRUTH, "token_strength": 0.0, "lookahead_quality": 1.0}
    res = fit_trace(path, base=base, knobs=["token_strength", "lookahead_quality"], seed=4)
    start = measure(SynthParams(**{**base, "vocab_size": res.params.vocab_size, "zipf_s": res.params.zipf_s}),
                    recall=True)
    for name in ("trajectory@1", "lookahead", "same_token"):
        want = res.target.recall[name]
        got = res.achieved.recall[name]
        assert got is not None and abs(got - want) < 0.05, (name, got, want)
        before = start.recall[name]
        assert before is None or abs(got - want) < abs(before - want), name
    assert res.params.token_strength == pytest.approx(0.9, abs=0.08)
    assert res.params.lookahead_quality == pytest.approx(0.5, abs=0.15)
    assert res.target.vocab_size is not None and res.target.vocab_size <= 100
    assert res.params.vocab_size == res.target.vocab_size  # the vocabulary comes from the trace's token ids
    assert {"popularity_skew", "layer_correlation", "token_locality", "topic_strength"} <= set(res.held)


def test_fit_explicit_targets_with_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    targets = tmp_path / "t.yaml"
    targets.write_text(yaml.safe_dump({"lookahead": {"value": 0.45, "source": "paper X, Table 2"},
                                       "previous_token": 0.4}))
    args = ["trace", "fit", *SMALL_SET, "--targets", str(targets), "--target", "lookahead=0.5",
            "--knobs", "lookahead_quality,token_locality"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr()[0])
    rows = {r["statistic"]: r for r in doc["rows"]}
    assert rows["lookahead"]["target"] == 0.5 and rows["lookahead"]["source"] == "--target"
    assert rows["previous_token"]["source"] == str(targets)
    assert abs(rows["lookahead"]["fitted"] - 0.5) < 0.05 and abs(rows["previous_token"]["fitted"] - 0.4) < 0.05
    assert "lookahead_quality" in doc["params"] and "token_strength" in doc["held"]
    targets.write_text(yaml.safe_dump({"lookahead": {"value": 0.45, "source": "paper X, Table 2"}}))
    assert main(["trace", "fit", *SMALL_SET, "--targets", str(targets), "--knobs", "lookahead_quality"]) == 0
    out = capsys.readouterr()[0]
    assert "paper X, Table 2" in out and "token_strength: not fitted (held at its base value)" in out


@pytest.mark.parametrize(("extra", "words"), [
    (["--target", "recall=0.4"], "--target: 'recall' is not a statistic"),
    (["--target", "lookahead=1.5"], "--target: lookahead: 1.5 is not a number in 0..1"),
    (["--target", "lookahead"], "--target 'lookahead': expected KEY=VALUE"),
    (["--targets", "missing.yaml"], "--targets 'missing.yaml': no such file"),
    ([], "give a trace FILE to fit, or targets with --targets/--target"),
])
def test_target_errors(extra: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "fit", *SMALL_SET, *extra]) == 2
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and words in err, err
