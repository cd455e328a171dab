"""benchmarks/buddymoe_rows.py: the readings' policies and the tables' noise floor."""

from __future__ import annotations

from benchmarks.buddymoe_rows import _policy_for, noise_floor
from benchmarks.seed_scoreboard import Row

BUDDY = {"name": "buddymoe", "params": {"base": "mixtral-offloading", "alpha": 0.95, "k_max": 16}}


def test_readings_rewrite_only_what_they_name() -> None:
    assert _policy_for("set", BUDDY) is BUDDY
    assert _policy_for("tae", BUDDY) == {"name": "buddymoe", "params": {"base": "mixtral-offloading", "tau": 0.95,
                                                                       "k_max": 16, "alpha": 1.0}}
    assert _policy_for("tae", "mixtral-offloading") == "mixtral-offloading"
    assert _policy_for("no prefetch", "mixtral-offloading") == "lru"
    assert _policy_for("no prefetch", BUDDY)["params"]["base"] == "lru"
    assert BUDDY["params"] == {"base": "mixtral-offloading", "alpha": 0.95, "k_max": 16}   # not changed in place


def _row(index: int, rate: float, params: dict[str, object], measured: float) -> Row:
    policy = {"name": "buddymoe", "params": {**BUDDY["params"], **params}}
    return Row(stem="s", index=index, role="test", metric="tokens_per_s", measured=measured, predicted=1.0,
               set={"cache.rate": rate, "policy": policy}, relative_to=None, groups={})


def test_noise_floor_names_a_cap_faster_than_no_cap() -> None:
    rows = [_row(3, 0.75, {}, 37.12), _row(4, 0.75, {"rho": 3}, 36.75), _row(5, 0.75, {"rho": 4}, 38.5),
            _row(9, 0.5, {}, 31.87), _row(11, 0.5, {"rho": 4}, 31.02), _row(13, 0.375, {"rho": 4}, 40.0)]
    assert noise_floor(rows) == ["c = 0.75: rho = 4 at 38.5 tokens/s beats the same lists without rho at 37.12 (+3.7%)"]
