"""The fine-grained MoE trained in this repository (``traces/samples/fine-moe``), its recipe and
its bundled trace; and that generalising the recipe left tiny-moe's recipe as it was.

Without torch: the shape is the fine-grained one asked for (>= 8 MoE layers, >= 32 experts,
top-4 or more, experts narrower than the hidden size), the catalog entry, the recipe preset and
the training log agree with the committed config and weights, the weights stay under 20 MB and
hash to the SHA-256 the NOTICE states, the bundled trace validates with every column, prefill
and decode, and its statistics are the README's. With the ``tracer`` extra: the weights load
(transformers, tracer, executor) and predict held-out text far better than random weights, the
recipe is deterministic for a seed on a few steps, and ``simctl model train --preset`` runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
from pathlib import Path

import numpy as np
import pytest

from moesim.sim.cli.main import main
from moesim.sim.config.catalog import get_model
from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import OPTIONAL_COLUMNS, read_meta, read_trace
from moesim.traces.tiny.recipe import FINE_MOE, PRESETS, TinyConfig, preset
from moesim.traces.tiny.tiny_corpus import is_held_out, load_corpus, stdlib_root
from moesim.traces.tiny.tiny_model import BUNDLED, FINE_NAME, NAME, model_dir, trace_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FILES = {f"mod{i}.py": f'"""Module {i}."""\n\ndef f{i}(x):\n    return x + {i}\n' * 8 for i in range(40)}


def _corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def _log() -> dict:
    return json.loads((model_dir(FINE_NAME) / "train_log.json").read_text())


# --------------------------------------------------------------------------------------------
# recipe, catalog, weights, trace (no torch)


def test_fine_moe_has_the_fine_grained_shape() -> None:
    spec = get_model(FINE_NAME)
    assert spec.num_layers >= 8 and spec.num_experts >= 32 and spec.top_k >= 4
    assert spec.expert_intermediate_size < spec.hidden_size
    # tiny-moe's experts cut in four: the same active expert FFN per token
    tiny = get_model(NAME)
    assert spec.top_k * spec.expert_intermediate_size == tiny.top_k * tiny.expert_intermediate_size
    assert (spec.num_layers, spec.num_experts, spec.top_k) == (
        FINE_MOE.num_layers, FINE_MOE.num_experts, FINE_MOE.top_k)


def test_tiny_recipe_is_unchanged() -> None:
    """The tiny preset is the dataclass defaults, and those are the committed tiny model's log
    (which recorded its run's 1 thread)."""
    assert PRESETS[NAME] == TinyConfig()
    log = json.loads((model_dir(NAME) / "train_log.json").read_text())
    assert dataclasses.asdict(TinyConfig(threads=1)) == log["config"]


def test_preset_overrides_and_errors() -> None:
    assert preset(FINE_NAME, steps=7, seed=None).steps == 7
    assert preset(FINE_NAME, seed=None).seed == FINE_MOE.seed
    with pytest.raises(MoesimError, match="unknown .*tiny-moe, fine-moe"):
        preset("nope")
    with pytest.raises(MoesimError, match="'depth'"):
        preset(FINE_NAME, depth=3)
    with pytest.raises(MoesimError, match="top_k 9 > num_experts 4"):
        preset(FINE_NAME, num_experts=4, top_k=9)


def test_catalog_recipe_log_and_config_agree_with_the_weights() -> None:
    pytest.importorskip("safetensors")
    from safetensors import safe_open

    folder = model_dir(FINE_NAME)
    cfg = json.loads((folder / "config.json").read_text())
    spec = get_model(FINE_NAME)
    assert cfg["model_type"] == "mixtral" and cfg["vocab_size"] == 257
    assert (spec.num_layers, spec.num_experts, spec.top_k) == (
        cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["num_experts_per_tok"])
    assert (spec.hidden_size, spec.expert_intermediate_size) == (cfg["hidden_size"], cfg["intermediate_size"])
    # the log's recipe is the preset (the shipped run used the preset as it is)
    assert _log()["config"] == dataclasses.asdict(FINE_MOE)
    with safe_open(str(folder / "model.safetensors"), framework="np") as f:
        sizes = {k: int(np.prod(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    experts = sum(n for k, n in sizes.items() if ".experts." in k)
    assert experts == spec.num_layers * spec.num_experts * 3 * spec.hidden_size * spec.expert_intermediate_size
    assert spec.non_expert_bytes == 2 * (sum(sizes.values()) - experts)
    assert (sum(sizes.values()), experts) == FINE_MOE.parameters()
    assert (folder / "model.safetensors").stat().st_size < 20_000_000


def test_weights_hash_to_the_sha256_the_notice_and_log_state() -> None:
    folder = model_dir(FINE_NAME)
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert _log()["weights_sha256"] == digest
    assert f"`{digest}`" in (folder / "NOTICE.md").read_text()


def test_bundled_trace_has_every_column_prefill_and_decode() -> None:
    path = trace_path(FINE_NAME)
    meta, tr = read_meta(path), read_trace(path)
    spec = get_model(FINE_NAME)
    assert (meta.model.num_layers, meta.model.num_experts, meta.model.top_k) == (
        spec.num_layers, spec.num_experts, spec.top_k)
    for col in OPTIONAL_COLUMNS:
        assert getattr(tr, col) is not None, col
    assert set(np.unique(tr.phase).tolist()) == {0, 1}
    assert meta.source["weights"] == "pretrained" and meta.source["model_path"].endswith(FINE_NAME)
    assert int(np.unique(tr.request_id).size) >= 8
    assert path.stat().st_size < 8_000_000


def test_trace_prompts_are_held_out_text() -> None:
    """The trace's prefill tokens are byte strings found in held-out files only (of the
    Python 3.11.7 standard library the model and the prompts came from)."""
    if platform.python_version() != "3.11.7":
        pytest.skip("the trace's prompts were cut from Python 3.11.7's standard library")
    tr = read_trace(trace_path(FINE_NAME))
    rows = (tr.layer == 0) & (tr.phase == 0)
    held = [p.read_bytes() for p in sorted(stdlib_root().rglob("*.py"))
            if is_held_out(p.relative_to(stdlib_root()).as_posix())]
    for rid in np.unique(tr.request_id[rows])[:3]:
        sel = rows & (tr.request_id == rid)
        order = np.argsort(tr.token_idx[sel], kind="stable")
        prompt = bytes(tr.token_id[sel][order].astype(np.uint8).tolist())
        assert any(prompt in text for text in held)


def test_trace_stats_match_the_readme() -> None:
    """The figures README.md quotes for the fine-moe trace (``simctl trace stats``)."""
    from moesim.traces.analysis.stats import trace_stats

    s = trace_stats(trace_path(FINE_NAME))
    ov = s.overall
    assert s.chance_reuse == pytest.approx(8 / 64)
    assert ov.entropy == pytest.approx(0.880, abs=5e-4)
    assert ov.top10_share == pytest.approx(0.360, abs=5e-4)
    assert ov.reuse == pytest.approx(0.446, abs=5e-4)
    assert ov.next_layer_acc == pytest.approx(0.657, abs=5e-4)
    assert ov.coact_sparsity == pytest.approx(0.717, abs=5e-4)
    assert ov.lru[16] == pytest.approx(0.626, abs=5e-4)


def test_model_path_names_a_bundled_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert BUNDLED == (NAME, FINE_NAME)
    assert main(["model", "path", FINE_NAME]) == 0
    assert capsys.readouterr().out.strip() == str(model_dir(FINE_NAME))
    assert main(["model", "path", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a bundled trained model" in err[0]


def test_executor_takes_the_bundled_fine_moe_weights() -> None:
    pytest.importorskip("torch")
    from moesim.sim.real.executor.model import model_argument

    assert model_argument(FINE_NAME, None) == (str(model_dir(FINE_NAME)), None)
    assert model_argument(None, get_model(FINE_NAME)) == (str(model_dir(FINE_NAME)), None)
    assert model_argument("random", get_model(FINE_NAME)) == (None, get_model(FINE_NAME))


# --------------------------------------------------------------------------------------------
# the committed weights and the recipe (tracer extra)


def _torch():
    pytest.importorskip("transformers")
    return pytest.importorskip("torch")


@pytest.mark.tracer
def test_committed_model_loads_and_beats_random_weights_on_held_out_text() -> None:
    torch = _torch()
    import transformers

    from moesim.sim.real.executor.model import load
    from moesim.traces.tiny.train_tiny import build_model, evaluate, routing_summary
    from moesim.traces.tracer.model_loading import load_model

    model = transformers.MixtralForCausalLM.from_pretrained(model_dir(FINE_NAME), dtype=torch.float32)
    assert model.config.num_local_experts == 64 and model.config.num_experts_per_tok == 8
    ids: list[int] = []
    for p in sorted(stdlib_root().glob("*.py")):
        if is_held_out(p.relative_to(stdlib_root()).as_posix()) and len(ids) < 4 * 1024:
            ids += list(p.read_bytes()[:1024])
    stream = torch.tensor(ids, dtype=torch.long)
    trained = evaluate(model, stream, 256, 4)
    random = evaluate(build_model(FINE_MOE), stream, 256, 4)
    assert random > 0.9 * math.log(257) and trained < 0.4 * random
    assert _log()["held_out_loss"] < 0.25 * _log()["random_model_held_out_loss"]
    rows = routing_summary(model, stream[:512])
    assert len(rows) == 8 and max(r["token_entropy"] for r in rows) < 0.8
    assert load_model(model_dir(FINE_NAME)).source["weights"] == "pretrained"
    om = load(str(model_dir(FINE_NAME)), None, torch.device("cpu"))
    assert (om.spec.num_layers, om.spec.num_experts, om.spec.top_k) == (8, 64, 8)


SMALL = dict(num_layers=2, hidden_size=16, num_heads=2, num_kv_heads=1, seq_len=16,
             batch_size=2, steps=3, eval_windows=2, threads=1)


@pytest.mark.tracer
def test_fine_recipe_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    torch = _torch()
    from moesim.traces.tiny.train_tiny import save, train

    corpus = load_corpus(_corpus_dir(tmp_path))
    a = train(preset(FINE_NAME, **SMALL), corpus)
    b = train(preset(FINE_NAME, **SMALL), corpus)
    c = train(preset(FINE_NAME, **SMALL, seed=5), corpus)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert sa["model.layers.0.mlp.experts.gate_up_proj"].shape == (64, 2 * 32, 16)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    out = save(a, tmp_path / "m", command="test", name=FINE_NAME)
    again = save(b, tmp_path / "n", command="test", name=FINE_NAME)
    log = json.loads((out / "train_log.json").read_text())
    assert log["weights_sha256"] == json.loads((again / "train_log.json").read_text())["weights_sha256"]
    assert log["device"] == "cpu" and log["name"] == FINE_NAME
    assert (out / "NOTICE.md").read_text().startswith(f"# {FINE_NAME}:")


@pytest.mark.tracer
def test_train_command_takes_a_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _torch()
    root = _corpus_dir(tmp_path)
    out = tmp_path / "model"
    args = ["model", "train", "--preset", FINE_NAME, "-o", str(out), "--corpus", str(root),
            "--steps", "2", "--layers", "1", "--hidden", "16", "--seq-len", "16",
            "--batch-size", "2", "--eval-windows", "2", "--threads", "1"]
    assert main(args) == 0
    assert "held-out loss" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]) == (64, 8, 32)
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["warmup"] == 1 and log["config"]["steps"] == 2
    assert main(["model", "train", "--preset", "nope", "-o", str(out), "--corpus", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--preset 'nope'" in err[0]
    assert main(["model", "train", "-o", str(out), "--corpus", str(root), "--device", "tpu",
                 "--steps", "1", "--layers", "1", "--hidden", "16", "--seq-len", "16",
                 "--eval-windows", "1"]) == 2
    assert "--device tpu" in capsys.readouterr().err
