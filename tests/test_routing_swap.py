"""benchmarks/routing_swap.py: a set's rows at fitted values on its own trace and on a changed one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import routing_swap  # noqa: E402

SET = {
    "name": "tiny-swap",
    "source": "hand-made",
    "notes": "a tiny set for the routing swap",
    "base": {
        "name": "tiny-swap",
        "trace": {"synthetic": {"model": "tiny-moe", "popularity_skew": 0.5, "requests": 2, "prompt_len": 4,
                                "decode_len": 8, "seed": 0}},
        "model": "tiny-moe",
        "hardware": "rtx-4090",
        "runtime": {"base": "none"},
        "cache": {"experts_per_layer": 2},
        "policy": "lru",
        "workload": {"batch_size": 1, "phases": ["decode"]},
        "seed": 0,
    },
    "fit": {"runtime.layer_us": {"min": 1, "max": 1000}},
    "rows": [
        {"set": {}, "tokens_per_s": 100.0, "role": "fit", "source": "made up", "read_off": False},
        {"set": {"cache.experts_per_layer": 4}, "hit_rate": 0.5, "role": "test", "source": "made up",
         "read_off": False},
    ],
}


def _write(tmp_path: Path, parameters: list[dict]) -> tuple[Path, Path]:
    ms = tmp_path / "tiny-swap.yaml"
    ms.write_text(yaml.safe_dump(SET))
    fit = tmp_path / "fit"
    fit.mkdir()
    (fit / "fitted.yaml").write_text(yaml.safe_dump({"parameters": parameters}))
    return ms, fit


def test_swapped_changes_a_copy_only():
    data = {"trace": {"synthetic": {"model": "m", "num_layers": 4, "seed": 0}}}
    out = routing_swap.swapped(data, {"preset": "p"}, ["model", "num_layers", "absent"])
    assert out == {"trace": {"synthetic": {"seed": 0, "preset": "p"}}}
    assert data == {"trace": {"synthetic": {"model": "m", "num_layers": 4, "seed": 0}}}


def test_same_trace_gives_zero_and_routing_moves_hit_rate(tmp_path):
    ms, fit = _write(tmp_path, [{"key": "runtime.layer_us", "value": 50.0, "per": None}])
    same = routing_swap.report(ms, fit, {"popularity_skew": 0.5}, [])
    assert same.count("+0.000%") == 2
    skewed = routing_swap.report(ms, fit, {"popularity_skew": 4.0}, [])
    hit_row = next(line for line in skewed.splitlines() if "hit_rate" in line)
    assert "+0.000%" not in hit_row   # a sharper popularity raises LRU's hit rate
    assert "runtime.layer_us = 50" in skewed


def test_per_group_fit_is_refused(tmp_path):
    ms, fit = _write(tmp_path, [{"key": "runtime.layer_us", "value": 50.0, "per": "hardware", "group": "x"}])
    with pytest.raises(SystemExit, match="per-group"):
        routing_swap.report(ms, fit, {}, [])
