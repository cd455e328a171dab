"""The tiny MoE trained in this repository (``traces/samples/tiny-moe``), its corpus, its training
script and its bundled trace.

Without torch: the corpus split is disjoint and stable, the catalog entry matches the committed
config, the bundled trace validates and has every column, the executor's default model is the
tiny MoE. With the ``tracer`` extra (skipped without): the committed weights load with
transformers' Mixtral classes and predict held-out text far better than random weights of the
same shape, its routing is not noise, and the training script runs a few steps on a tiny
folder, deterministically for a fixed seed.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from moesim.sim.cli.main import main
from moesim.sim.config.catalog import get_model
from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import OPTIONAL_COLUMNS, read_meta, read_trace
from moesim.traces.tiny.tiny_corpus import (
    EOS_ID,
    HELD_OUT_MODULUS,
    held_out_prompts,
    is_held_out,
    load_corpus,
    stdlib_root,
)
from moesim.traces.tiny.tiny_model import NAME, model_dir, trace_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FILES = {f"mod{i}.py": f'"""Module {i}."""\n\ndef f{i}(x):\n    return x + {i}\n' * 8 for i in range(40)}


def _corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "skip.bin").write_bytes(b"\xff\xfe")
    return root


def _torch():
    pytest.importorskip("transformers")
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------------------------
# corpus, catalog, trace (no torch)


def test_corpus_split_is_by_path_hash_and_disjoint(tmp_path: Path) -> None:
    root = _corpus_dir(tmp_path)
    c = load_corpus(root)
    held = sorted(n for n in FILES if is_held_out(n))
    assert 0 < len(held) < len(FILES)
    assert (c.train_files, c.held_out_files) == (len(FILES) - len(held), len(held))
    # each file ends with EOS; the streams hold exactly their files' bytes
    assert int((c.held_out == EOS_ID).sum()) == len(held)
    assert c.held_out.size == sum(len(FILES[n].encode()) + 1 for n in held)
    assert load_corpus(root).digest == c.digest
    # prompts come from held-out files only: every prompt is a substring of one of them
    held_text = [FILES[n] for n in held]
    for p in held_out_prompts(c, 5, 40, seed=3):
        assert any(p in t for t in held_text)
    assert held_out_prompts(c, 5, 40, seed=3) == held_out_prompts(c, 5, 40, seed=3)


def test_held_out_share_of_the_stdlib_is_about_one_in_ten() -> None:
    names = [p.relative_to(stdlib_root()).as_posix() for p in stdlib_root().glob("*.py")]
    share = sum(map(is_held_out, names)) / len(names)
    assert abs(share - 1 / HELD_OUT_MODULUS) < 0.06


def test_corpus_errors_name_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(MoesimError, match="no such folder"):
        load_corpus(tmp_path / "nope")
    (tmp_path / "one.txt").write_text("only one file\n")
    with pytest.raises(MoesimError, match="both sides of the held-out split"):
        load_corpus(tmp_path)


def test_catalog_entry_matches_the_committed_config() -> None:
    pytest.importorskip("safetensors")
    cfg = json.loads((model_dir() / "config.json").read_text())
    spec = get_model(NAME)
    assert cfg["model_type"] == "mixtral"
    assert (spec.num_layers, spec.num_experts, spec.top_k) == (
        cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["num_experts_per_tok"])
    assert (spec.hidden_size, spec.expert_intermediate_size) == (cfg["hidden_size"], cfg["intermediate_size"])
    # non_expert_bytes: every float16 parameter that is not a routed expert
    from safetensors import safe_open

    with safe_open(str(model_dir() / "model.safetensors"), framework="np") as f:
        sizes = {k: int(np.prod(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    experts = sum(n for k, n in sizes.items() if ".experts." in k)
    assert experts == spec.num_layers * spec.num_experts * 3 * spec.hidden_size * spec.expert_intermediate_size
    assert spec.non_expert_bytes == 2 * (sum(sizes.values()) - experts)
    assert (model_dir() / "model.safetensors").stat().st_size < 10_000_000


def test_bundled_trace_has_every_column_prefill_and_decode() -> None:
    meta = read_meta(trace_path())
    tr = read_trace(trace_path())
    spec = get_model(NAME)
    assert (meta.model.num_layers, meta.model.num_experts, meta.model.top_k) == (
        spec.num_layers, spec.num_experts, spec.top_k)
    for col in OPTIONAL_COLUMNS:
        assert getattr(tr, col) is not None, col
    phases = set(np.unique(tr.phase).tolist())
    assert phases == {0, 1}
    assert meta.source["weights"] == "pretrained"
    assert int(np.unique(tr.request_id).size) >= 8
    assert trace_path().stat().st_size < 8_000_000


def test_trace_stats_match_the_readme() -> None:
    """The figures README.md quotes for the bundled trace (``simctl trace stats``, column all)."""
    from moesim.traces.analysis.stats import trace_stats

    s = trace_stats(trace_path())
    ov = s.overall
    assert s.chance_reuse == pytest.approx(2 / 16)
    assert ov.entropy == pytest.approx(0.749, abs=5e-4)
    assert ov.top10_share == pytest.approx(0.428, abs=5e-4)
    assert ov.reuse == pytest.approx(0.497, abs=5e-4)
    assert ov.next_layer_acc == pytest.approx(0.508, abs=5e-4)
    assert ov.coact_sparsity == pytest.approx(0.860, abs=5e-4)
    assert ov.lru[4] == pytest.approx(0.710, abs=5e-4)


def test_executor_default_model_is_the_tiny_moe() -> None:
    pytest.importorskip("torch")
    from moesim.sim.real.executor.model import model_argument

    spec = get_model(NAME)
    assert model_argument(None, spec) == (str(model_dir()), None)
    assert model_argument(NAME, None) == (str(model_dir()), None)
    assert model_argument("random", spec) == (None, spec)
    other = get_model("flame-moe-290m")
    assert model_argument(None, other) == (None, other)
    with pytest.raises(MoesimError, match="random"):
        model_argument("random", None)


def test_model_path_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(model_dir())


# --------------------------------------------------------------------------------------------
# the committed weights (tracer extra)


def _held_out_ids(n_files: int = 4, per_file: int = 2048) -> list[int]:
    root = stdlib_root()
    ids: list[int] = []
    for p in sorted(root.glob("*.py")):
        rel = p.relative_to(root).as_posix()
        if is_held_out(rel) and len(ids) < n_files * per_file:
            ids += list(p.read_bytes()[:per_file])
    return ids


@pytest.mark.tracer
def test_committed_model_loads_and_beats_random_weights_on_held_out_text() -> None:
    torch = _torch()
    import transformers

    from moesim.traces.tiny.train_tiny import TinyConfig, build_model, evaluate, routing_summary

    model = transformers.MixtralForCausalLM.from_pretrained(model_dir(), dtype=torch.float32)
    cfg = model.config
    assert type(model).__name__ == "MixtralForCausalLM" and cfg.vocab_size == 257
    shape = TinyConfig(num_layers=cfg.num_hidden_layers, num_experts=cfg.num_local_experts,
                       top_k=cfg.num_experts_per_tok, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_heads=cfg.num_attention_heads,
                       num_kv_heads=cfg.num_key_value_heads)
    stream = torch.tensor(_held_out_ids(), dtype=torch.long)
    trained = evaluate(model, stream, 256, 8)
    random = evaluate(build_model(shape), stream, 256, 8)
    assert random > 0.9 * math.log(257)
    assert trained < 0.5 * random
    log = json.loads((model_dir() / "train_log.json").read_text())
    assert log["held_out_loss"] < 0.5 * log["random_model_held_out_loss"]
    # learned routing: confident routers (token entropy far below uniform), where random
    # weights are near uniform
    rows = routing_summary(model, stream[:1024])
    rand_rows = routing_summary(build_model(shape), stream[:1024])
    assert max(r["token_entropy"] for r in rows) < 0.8 < min(r["token_entropy"] for r in rand_rows)


@pytest.mark.tracer
def test_committed_model_loads_through_the_tracer_and_executor() -> None:
    torch = _torch()
    from moesim.sim.real.executor.model import load
    from moesim.traces.tracer.model_loading import load_model

    lm = load_model(model_dir())
    assert lm.source["weights"] == "pretrained" and lm.vocab_size == 257
    om = load(str(model_dir()), None, torch.device("cpu"))
    spec = get_model(NAME)
    assert (om.spec.num_layers, om.spec.num_experts, om.spec.top_k) == (
        spec.num_layers, spec.num_experts, spec.top_k)


# --------------------------------------------------------------------------------------------
# the training script (tracer extra)

SMALL = dict(num_layers=2, num_experts=4, top_k=2, hidden_size=16, intermediate_size=16,
             num_heads=2, num_kv_heads=1, seq_len=16, batch_size=2, steps=4, warmup=1,
             eval_windows=2, threads=1)


@pytest.mark.tracer
def test_training_runs_and_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    torch = _torch()
    from moesim.traces.tiny.train_tiny import TinyConfig, save, train

    corpus = load_corpus(_corpus_dir(tmp_path))
    a = train(TinyConfig(**SMALL, seed=1), corpus)
    b = train(TinyConfig(**SMALL, seed=1), corpus)
    c = train(TinyConfig(**SMALL, seed=2), corpus)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    def strip(h: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in h]

    assert strip(a.history) == strip(b.history) and a.history[-1]["step"] == SMALL["steps"]
    # the loss includes the router's load-balancing term, which the log reports
    assert all(h["aux_loss"] > 0 for h in a.history)
    out = save(a, tmp_path / "m", command="test")
    import transformers

    again = transformers.MixtralForCausalLM.from_pretrained(out)
    assert again.config.num_local_experts == 4
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["seed"] == 1 and "Seed: 1" in (out / "NOTICE.md").read_text()


@pytest.mark.tracer
def test_train_tiny_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _torch()
    root = _corpus_dir(tmp_path)
    out = tmp_path / "model"
    args = ["model", "train-tiny", "-o", str(out), "--corpus", str(root), "--steps", "2",
            "--layers", "1", "--experts", "4", "--hidden", "16", "--intermediate", "16",
            "--seq-len", "16", "--batch-size", "2", "--eval-windows", "2", "--threads", "1"]
    assert main(args) == 0
    assert "held-out loss" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file() and (out / "NOTICE.md").is_file()
    assert main(["model", "train-tiny", "-o", str(out), "--corpus", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such folder" in err[0]
    assert main(["model", "train-tiny", "-o", str(out), "--corpus", str(root), "--top-k", "9",
                 "--experts", "4"]) == 2
    assert "top_k 9 > num_experts 4" in capsys.readouterr().err
