"""The scoreboard names what a row measured where its ``set`` names no policy: the row's or the
measurement file's ``system``, else the base's policy (never ``?``)."""

from __future__ import annotations

import yaml

import benchmarks.scoreboard_rows as rows_mod
import benchmarks.seed_scoreboard as sb


def _row(index: int, setting: dict, named: str) -> sb.Row:
    return sb.Row(stem="s", index=index, role="test", metric="tokens_per_s", measured=1.0, predicted=1.0,
                  set=setting, relative_to=None, groups={}, named=named)


def test_rows_without_a_policy_are_named_by_system_then_base_policy(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    doc = {"name": "s", "system": "ktransformers", "base": {"policy": {"name": "cpu-moe", "params": {"dense_blocks": 3}}},
           "rows": [{"set": {}}, {"set": {}, "system": "fiddler"}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(rows_mod, "MEASUREMENTS", tmp_path)
    assert rows_mod._named("s") == [("ktransformers", "ktransformers"), ("fiddler", "fiddler")]
    del doc["system"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    assert rows_mod._named("s") == [(None, "cpu-moe(dense_blocks=3)"), ("fiddler", "fiddler")]
    assert rows_mod._named("absent") == []


def test_a_rows_own_policy_is_its_label() -> None:
    assert sb._row_label(_row(0, {}, "fiddler")) == "fiddler"
    assert sb._row_label(_row(1, {"policy": "lru"}, "fiddler")) == "lru"


def _sys(measured: float, predicted: float, system: str | None, model: object = "m", gpu: object = "g",
         role: str = "test") -> sb.Row:
    return sb.Row(stem="s", index=0, role=role, metric="tokens_per_s", measured=measured, predicted=predicted,
                  set={"model": model, "hardware": gpu}, relative_to=None, groups={}, declared=system)


def test_system_pairs_order_published_systems_on_one_model_and_gpu() -> None:
    from benchmarks.system_pairs import system_pairs

    kt, llama = _sys(16.0, 20.0, "ktransformers", {"base": "m", "dtype_bytes": 0.5}), _sys(9.0, 13.0, "cpu-moe")
    fiddler = _sys(2.4, 5.0, "fiddler")
    assert [ok for _, _, ok in system_pairs([kt, llama, fiddler])] == [True, True, True]
    wrong = _sys(9.0, 25.0, "cpu-moe")                        # predicted above kTransformers: wrong
    assert [ok for _, _, ok in system_pairs([kt, wrong])] == [False]
    assert system_pairs([kt, _sys(9.0, 9.0, "ktransformers")]) == []          # one system
    assert system_pairs([kt, _sys(9.0, 9.0, "cpu-moe", gpu="other")]) == []   # another GPU
    assert system_pairs([kt, _sys(9.0, 9.0, None)]) == []                     # no declared system
    assert system_pairs([kt, _sys(9.0, 9.0, "cpu-moe", role="fit")]) == []    # a fit row
    assert system_pairs([kt, _sys(16.1, 9.0, "cpu-moe")]) == []               # within 1%
    assert [ok for _, _, ok in system_pairs([kt, _sys(9.0, 20.0, "cpu-moe")])] == [False]   # a tie
