"""The synthetic presets fitted to published statistics (issue 22 item 2): every committed
targets file parses and cites a source for each target, and each fitted preset gives, at its
own workload and seed 0 (the figures of ``benchmarks/fit_presets.py``), every target within
the tolerance the file states, except the misses listed here with the reason the report
gives."""

from __future__ import annotations

import pytest

from moesim.traces.synthetic.fit_targets import lru_size, top_size
from moesim.traces.synthetic.generator import parse_params
from moesim.traces.synthetic.preset_targets import (
    TARGETS_DIR,
    compare,
    compare_preset,
    fitted_presets,
    preset_targets,
)
from moesim.traces.synthetic.presets import FITTED_PRESETS, LEGACY_PRESETS

KNOWN_MISSES = {
    # the context keeps 7% of the variance once the token takes 91%: per-layer reuse moves
    # by a couple of points at most, so the deepest layers stay about 0.045 below the line
    ("mixtral-8x7b", "reuse"): 0.06,
    # random router columns alone give the 10 most routed of 60 experts 26% of the selections
    # (popularity_skew 0, token_strength 0), above MoEpic's LFU figure of 24.4%
    ("qwen1.5-moe-a2.7b", "top@10"): 0.09,
    ("qwen1.5-moe-a2.7b", "top@20"): 0.10,
    ("qwen1.5-moe-a2.7b", "top@30"): 0.10,
    # the same limit as Mixtral's: with the token at 48% of the variance and the topic at 25%,
    # locality at 0.99 leaves reuse 0.06 under imp's 45% on the mean, 0.11 at the worst layer
    # (the LRU target is met)
    ("qwen3-30b-a3b", "reuse"): 0.12,
}
"""(preset, statistic) -> the largest error allowed for the targets the fit cannot meet."""


def test_every_fitted_preset_has_a_targets_file_and_a_legacy_twin() -> None:
    assert fitted_presets() == list(FITTED_PRESETS)
    assert sorted(p.stem for p in TARGETS_DIR.glob("*.yaml")) == sorted(FITTED_PRESETS)
    for name, knobs in FITTED_PRESETS.items():
        legacy = LEGACY_PRESETS[f"{name}-legacy"]
        assert knobs["model"] == legacy["model"] and knobs["token_strength"] > 0
        assert knobs.get("lookahead_quality", 1.0) == 1.0  # published lookahead reads the real state


@pytest.mark.parametrize("preset", sorted(FITTED_PRESETS))
def test_targets_file_parses_and_cites_every_target(preset: str) -> None:
    entries = preset_targets(preset)
    shape = parse_params({"preset": preset}).shape()
    assert entries
    for name, entry in entries.items():
        # a citation of its own (a bare number would take the file's path as its source)
        assert entry.source != str(TARGETS_DIR / f"{preset}.yaml"), name
        assert len(entry.source) > 20 and entry.metric.strip(), name
        assert 0 < entry.tolerance <= 0.1, name
        size = lru_size(name) or top_size(name)
        assert size is None or size <= shape.num_experts, name
        recorded = entry.source.startswith("recorded:")
        assert recorded == ("traces/samples/" in entry.source), name
        if recorded:  # carried from a recorded trace: the metric says how, and the trace exists
            assert "chance" in entry.metric, name
            rel = entry.source.split()[1].rstrip(",")
            assert (TARGETS_DIR.parents[2] / rel).is_file(), rel


@pytest.mark.parametrize("preset", sorted(FITTED_PRESETS))
def test_refitted_preset_meets_its_targets(preset: str) -> None:
    """At the preset's workload and seed 0 (what benchmarks/fit_presets.py reports)."""
    rows = compare_preset(preset)
    assert {r.statistic for r in rows} == set(preset_targets(preset))
    for r in rows:
        assert r.achieved is not None and r.error is not None, r.statistic
        bound = KNOWN_MISSES.get((preset, r.statistic))
        if bound is None:
            assert r.met, (r.statistic, r.target, r.achieved, r.entry.tolerance)
        else:
            assert not r.met and r.error <= bound, (r.statistic, r.target, r.achieved)


def test_legacy_presets_miss_what_the_refit_meets() -> None:
    """The fit changed something: the legacy Qwen preset's LRU hit rates are far above MoEpic's
    Table 1, the refitted one's within tolerance."""
    targets = preset_targets("qwen1.5-moe-a2.7b")
    old = {r.statistic: r for r in compare(parse_params({"preset": "qwen1.5-moe-a2.7b-legacy"}), targets)}
    new = {r.statistic: r for r in compare(parse_params({"preset": "qwen1.5-moe-a2.7b"}), targets)}
    for name in ("lru@10", "lru@20", "lru@30"):
        assert new[name].met and not old[name].met and old[name].error > 0.2
