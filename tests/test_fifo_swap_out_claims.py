"""Under ``pcie.order: fifo`` with ``cache.swap_out``, a prefetch waiting for draining room holds
a claim, not an issued copy: when a demand load of its pool finds no room, the claim is given
up (as under priority order), instead of outliving the drain and making the demand load evict
another expert. Before the fix, these runs broke the VRAM invariant (claims above draining
room) for every prefetcher below."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.run.runner import run_loaded

POLICIES = ["moe-infinity", "prefetch-fallback", "adapmoe", "buddymoe", "moe-apex-style", "mixtral-offloading"]


def _run(policy: str, order: str) -> dict[str, object]:
    data = {"trace": {"synthetic": {"preset": "mixtral-8x7b-legacy", "num_layers": 8, "requests": 2, "prompt_len": 8,
                                    "decode_len": 40, "seed": 1}},
            "model": {"base": "mixtral-8x7b", "num_layers": 8}, "hardware": "a100-pcie-80gb",
            "cache": {"experts_per_layer": 2.5, "swap_out": True}, "pcie": {"order": order}, "policy": policy}
    loaded = load_scenario_data(data, source="test", base_dir=Path("."))
    return run_loaded(loaded, check_invariants=True, steps=False).metrics


@pytest.mark.parametrize("policy", POLICIES)
def test_claims_never_outlive_their_draining_room(policy: str) -> None:
    """The VRAM invariant holds after every step under fifo (it always did under priority)."""
    fifo = _run(policy, "fifo")
    prio = _run(policy, "priority")
    assert 0 < float(fifo["hit_rate"]) < 1 and 0 < float(prio["hit_rate"]) < 1
