"""The quality harness of lossy plans on a tiny random Mixtral (CPU, float32): an identity plan
leaves the output unchanged, a plan that drops experts changes it, and CommitMoE's plans reach
the model. Skips without the ``tracer`` extra."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import numpy as np
import pytest

from moesim.policies.contract.base import Plan, Routing, View
from moesim.policies.parts.caches import LRUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.planners import Planner
from moesim.sim.core.errors import MoesimError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")        # the harness runs a real model: the tracer extra
pytest.importorskip("transformers")

TEXTS = [[5, 17, 99, 3, 64, 8, 21, 42, 7, 11], [1, 2, 3, 4, 5, 6, 7, 8],
         [9, 30, 31, 77, 12, 5, 60, 61, 2, 44, 90], [100, 3, 3, 8, 19, 27, 50, 9]]


@cache
def _model() -> Any:
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(
        "mixtral", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        num_local_experts=8, num_experts_per_tok=2, initializer_range=0.2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        return transformers.AutoModelForCausalLM.from_config(cfg).eval()


class _RowPlanner(Planner):
    """Plans every token of every iteration: the routing as is, or with its last slot dropped."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        ex = routing.experts.astype(np.int64)
        if self.drop:
            ex[:, -1] = -1
        return Plan(ex)


class _Planned(Composed):
    name = "test-planned"
    lossy = True

    def __init__(self, *, drop: bool = False) -> None:
        self.drop = drop
        self.assemble(cache=LRUCache(), planner=_RowPlanner(drop))


def test_identity_plan_leaves_the_output_unchanged() -> None:
    from moesim.sim.real.quality import evaluate_plans

    res = evaluate_plans(_model(), TEXTS, _Planned(drop=False), cache_rate=0.5)
    assert res.planned_token_layers == 1.0              # every token-layer went through the plan
    assert res.kl == pytest.approx(0.0, abs=1e-9)
    assert res.agreement == 1.0
    assert res.ppl_delta == pytest.approx(0.0, abs=1e-9)
    assert res.tokens == sum(len(t) for t in TEXTS)


def test_dropping_experts_changes_the_output() -> None:
    from moesim.sim.real.quality import evaluate_plans

    res = evaluate_plans(_model(), TEXTS, _Planned(drop=True), cache_rate=0.5)
    assert res.planned_token_layers == 1.0
    assert res.kl > 1e-3
    assert res.agreement < 1.0
    assert res.sim["dropped_per_token"] == pytest.approx(3.0)   # one slot of 3 layers per token
    assert res.sim["effective_top_k"] == pytest.approx(1.0)


def test_commitmoe_plans_run_on_the_model() -> None:
    from moesim.sim.real.quality import evaluate_plans

    res = evaluate_plans(_model(), TEXTS, "commitmoe", profile_texts=1, cache_rate=0.5)
    assert res.texts == 3 and res.sim["policy_report"]["predictor"] == "lookahead"
    committed = res.sim["policy_report"]["committed_token_layers"]
    # each text's first token commits layers 1 and 2, every later token all 3 layers
    assert committed == sum(3 * len(t) - 1 for t in TEXTS[1:])
    assert res.planned_token_layers == pytest.approx(committed / (3 * sum(len(t) for t in TEXTS[1:])))
    wrong = sum(n for pct, n in res.sim["policy_report"]["commit_accuracy_pct"].items() if pct != "100")
    assert (res.kl > 0) == (wrong > 0)


def test_bad_arguments_are_one_line_errors() -> None:
    from moesim.sim.real.quality import evaluate_plans

    with pytest.raises(MoesimError, match="leaves no text"):
        evaluate_plans(_model(), TEXTS, "commitmoe", profile_texts=4)
    with pytest.raises(MoesimError, match="at least 2 tokens"):
        evaluate_plans(_model(), [[1]], "commitmoe")


def test_simctl_quality_prints_the_figures_and_refuses_bad_input(tmp_path: Any, capsys: Any) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import json

    from moesim.sim.cli.main import main

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "mixtral", "vocab_size": 128, "hidden_size": 32,
                               "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "max_position_embeddings": 128,
                               "num_local_experts": 4, "num_experts_per_tok": 2}))
    texts = tmp_path / "texts.txt"
    texts.write_text("the quick brown fox\njumps over the lazy dog\n")
    rc = main(["quality", "--model", str(cfg), "--texts", str(texts), "--cache-rate", "0.5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["policy"] == "commitmoe" and out["texts"] == 2 and out["kl"] >= 0
    assert out["sim"]["policy_report"]["predictor"] == "lookahead"
    rc = main(["quality", "--model", str(cfg), "--texts", str(texts), "--param", "predictor=oracle"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "predictor must be one of" in err


def test_the_bundled_tiny_moe_is_the_default_model_and_text(tmp_path: Any, capsys: Any) -> None:
    """Without --model and --texts the harness runs the trained tiny MoE on its held-out text,
    and leaves no temporary file behind; another model needs --texts."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import glob
    import json
    import tempfile

    from moesim.sim.cli.main import main

    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "moesim-quality-*")))
    rc = main(["quality", "--policy", "random-substitute", "--default-texts", "3", "--profile-texts", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["texts"] == 2 and out["model"]["weights"] == "pretrained"
    assert "tiny-moe" in json.dumps(out["model"])
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "moesim-quality-*"))) == before
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    assert main(["quality", "--model", str(tmp_path)]) == 2
    assert "--texts is needed" in capsys.readouterr().err
