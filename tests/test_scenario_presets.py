"""The paper scenarios run the fitted routing presets (issue 32), and
``benchmarks/scenario_presets.py`` compares each with the ``-legacy`` preset it ran before."""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.scenario_presets import (
    MOEPIC_QWEN_KNOBS,
    PAPER_DIRS,
    ROOT,
    legacy_of,
    moved_scenarios,
)


def _synthetic(path: Path) -> dict:
    return ((yaml.safe_load(path.read_text()) or {}).get("trace") or {}).get("synthetic") or {}


def test_every_synthetic_paper_scenario_names_a_fitted_preset() -> None:
    """Each paper scenario on synthetic routing names its model's fitted preset (LLaMA-MoE's
    included, since its preset was fitted)."""
    synthetic = [p for d in PAPER_DIRS for p in sorted((ROOT / "scenarios" / d).glob("*.yaml")) if _synthetic(p)]
    assert [p.name for p in synthetic if "preset" not in _synthetic(p)] == []
    assert moved_scenarios() == synthetic
    assert len(moved_scenarios()) == 25


def test_llama_moe_legacy_preset_is_the_hand_set_trace_it_replaced() -> None:
    """The ActiveEvict LLaMA-MoE scenario's legacy column runs the knobs it was committed with
    before its preset was fitted, byte for byte."""
    from moesim.traces.synthetic.generator import parse_params

    path = ROOT / "scenarios" / "activeevict" / "llama-moe-h20-activeevict.yaml"
    old = legacy_of(yaml.safe_load(path.read_text()), path)["trace"]["synthetic"]
    hand = {"model": "llama-moe-3.5b-4-16", "popularity_skew": 0.3, "token_locality": 0.25,
            "layer_correlation": 0.9, "topic_strength": 0.45, "num_topics": 16, "requests": 2,
            "prompt_len": 16, "decode_len": 48, "seed": 0}
    assert parse_params(old).model_dump(exclude={"preset"}) == parse_params(hand).model_dump(exclude={"preset"})


def test_the_legacy_column_is_the_trace_the_scenario_ran_before() -> None:
    moepic = ROOT / "scenarios" / "moepic" / "qwen-a6000-moepic.yaml"
    data = yaml.safe_load(moepic.read_text())
    old = legacy_of(data, moepic)["trace"]["synthetic"]
    assert old == {**data["trace"]["synthetic"], "preset": "qwen1.5-moe-a2.7b-legacy", **MOEPIC_QWEN_KNOBS}
    assert data["trace"]["synthetic"]["preset"] == "qwen1.5-moe-a2.7b"   # the input is left as it was
    fmoe = ROOT / "scenarios" / "fmoe" / "mixtral-3090x6-fmoe.yaml"
    data = yaml.safe_load(fmoe.read_text())
    assert legacy_of(data, fmoe)["trace"]["synthetic"] == {**data["trace"]["synthetic"], "preset": "mixtral-8x7b-legacy"}


def test_the_committed_results_list_every_moved_scenario() -> None:
    text = (ROOT / "benchmarks" / "results" / "fitted_scenarios.md").read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and ".yaml" in line]
    assert rows == [str(p.relative_to(ROOT / "scenarios")) for p in moved_scenarios()]
