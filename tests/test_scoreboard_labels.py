"""The scoreboard names what a row measured where its ``set`` names no policy: the row's or the
measurement file's ``system``, else the base's policy (never ``?``)."""

from __future__ import annotations

import yaml

import benchmarks.seed_scoreboard as sb


def _row(index: int, setting: dict, named: str) -> sb.Row:
    return sb.Row(stem="s", index=index, role="test", metric="tokens_per_s", measured=1.0, predicted=1.0,
                  set=setting, relative_to=None, groups={}, named=named)


def test_rows_without_a_policy_are_named_by_system_then_base_policy(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    doc = {"name": "s", "system": "ktransformers", "base": {"policy": {"name": "cpu-moe", "params": {"dense_blocks": 3}}},
           "rows": [{"set": {}}, {"set": {}, "system": "fiddler"}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(sb, "MEASUREMENTS", tmp_path)
    assert sb._named("s") == ["ktransformers", "fiddler"]
    del doc["system"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    assert sb._named("s") == ["cpu-moe(dense_blocks=3)", "fiddler"]
    assert sb._named("absent") == []


def test_a_rows_own_policy_is_its_label() -> None:
    assert sb._row_label(_row(0, {}, "fiddler")) == "fiddler"
    assert sb._row_label(_row(1, {"policy": "lru"}, "fiddler")) == "lru"
