"""accelerate's placement rule for Eliseev & Mazur's naive rows (benchmarks/accelerate_placement.py):
the counts by hand, and the measurement sets carrying exactly the counts the rule gives."""

from __future__ import annotations

import yaml

from benchmarks.accelerate_placement import resident_layers
from tests.util import ROOT

SETS = ("eliseev-mazur-2023-table2", "eliseev-mazur-2023-table2-one-runtime", "eliseev-mazur-2023-table2-miss-cost")


def test_counts_by_hand() -> None:
    # RTX 3080 Laptop, 2-bit: 0.9 x (16 - 0.5) GiB = 13.95 GiB; less the fp16 embeddings (0.244 GiB)
    # and one layer's room (0.533 GiB) leaves 13.17 GiB, 24.7 layers of 0.533 GiB
    assert resident_layers("rtx-3080-laptop-16gb", "mixtral-8x7b-hqq-a4e2") == 24
    assert resident_layers("rtx-3060-12gb", "mixtral-8x7b-hqq-a4e2") == 17
    assert resident_layers("t4", "mixtral-8x7b-hqq-a4e3") == 18
    # the whole 2-bit model (17.5 GiB) fits in 90% of the A100's 80 GB: nothing offloaded
    assert resident_layers("a100-sxm-80gb", "mixtral-8x7b-hqq-a4e2") == 32
    # a larger CUDA context can only take layers away
    assert resident_layers("rtx-3080-laptop-16gb", "mixtral-8x7b-hqq-a4e3", 0.8) <= \
        resident_layers("rtx-3080-laptop-16gb", "mixtral-8x7b-hqq-a4e3", 0.3)


def test_sets_carry_the_rule() -> None:
    for stem in SETS:
        rows = yaml.safe_load((ROOT / "measurements" / f"{stem}.yaml").read_text())["rows"]
        naive = [r["set"] for r in rows if r["set"]["policy"] == "accelerate"]
        assert len(naive) == 7, stem
        for s in naive:
            if s["hardware"] == "a100-sxm-80gb":   # the rule keeps every layer; the paper's cap is unknown
                assert "policy.params" not in s and s["cache.experts_per_layer"] == 4
                continue
            n = resident_layers(s["hardware"], s["model"])
            assert s["policy.params"] == {"resident_layers": n}, (stem, s)
            assert s["cache.experts_per_layer"] == 8 * (n + 1) / 32, (stem, s)
