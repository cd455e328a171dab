"""The torch tracer's prompt reading and model loading, and ``simctl trace record`` on the command
line (``traces/tracer/``), on tiny random models. Tests that need torch skip without the
``tracer`` extra."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import read_trace
from tests.tracer_models import COMMON, PROMPT, build_model, torch_or_skip

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tr() -> Any:
    """The tracer module (skips without torch/transformers)."""
    torch_or_skip()
    from moesim.traces.tracer import tracer
    return tracer


# --------------------------------------------------------------------------------------------
# Prompts and models


def test_read_prompts_formats_and_errors(tr: Any, tmp_path: Path) -> None:
    txt = tmp_path / "p.txt"
    txt.write_text("hi\n\nhé\n", encoding="utf-8")
    prompts, how = tr.read_prompts(txt, tokenizer=None, vocab_size=128)
    assert how == "bytes"
    assert [p.input_ids for p in prompts] == [(104, 105), (104, 0xC3 % 128, 0xA9 % 128)]
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"input_ids": [1, 2], "completion_ids": [3]}\n{"text": "a", "completion": "b"}\n')
    prompts, how = tr.read_prompts(jl, tokenizer=None, vocab_size=128)
    assert prompts == [tr.Prompt((1, 2), (3,)), tr.Prompt((97,), (98,))]
    assert how == "bytes+input_ids"
    for bad, msg in [('{"txt": "a"}', "unknown key 'txt'"), ('{"input_ids": [1, 999]}', "outside 0..127"),
                     ('{"text": "a", "input_ids": [1]}', "exactly one"), ("[1]", "JSON object"),
                     ('{"input_ids": []}', "no tokens"), ("{", "not valid JSON")]:
        jl.write_text(bad + "\n")
        with pytest.raises(MoesimError, match=msg) as err:
            tr.read_prompts(jl, tokenizer=None, vocab_size=128)
        assert "line 1" in str(err.value) and "\n" not in str(err.value)


def test_load_model_from_config_is_seeded_and_local_only(tr: Any, tmp_path: Path) -> None:
    torch = torch_or_skip()
    cfg = {"model_type": "mixtral", **COMMON, "num_local_experts": 4, "num_experts_per_tok": 2}
    (tmp_path / "tiny.json").write_text(json.dumps(cfg))
    a = tr.load_model(tmp_path / "tiny.json", seed=3)
    b = tr.load_model(tmp_path / "tiny.json", seed=3)
    c = tr.load_model(tmp_path / "tiny.json", seed=4)
    wa, wb, wc = (m.model.model.layers[0].mlp.gate.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.name == "tiny" and a.tokenizer is None and a.source["weights"] == "random (seed 3)"
    # a directory with config.json only is a config too; with weights it is loaded
    d = tmp_path / "tinydir"
    a.model.config.save_pretrained(d)
    assert tr.load_model(d, seed=3).source["weights"] == "random (seed 3)"
    a.model.save_pretrained(d)
    loaded = tr.load_model(d, dtype="bfloat16")
    assert loaded.source["weights"] == "pretrained"
    assert torch.equal(loaded.model.model.layers[0].mlp.gate.weight, wa.to(torch.bfloat16))
    # a tokenizer next to the weights is used for text prompts
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    wl = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    wl.pre_tokenizer = pre_tokenizers.Whitespace()
    wl.train_from_iterator(["the quick brown fox jumps over the lazy dog"],
                           trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=wl, unk_token="[UNK]").save_pretrained(d)
    with_tok = tr.load_model(d)
    assert with_tok.tokenizer is not None
    (tmp_path / "p.txt").write_text("the lazy fox\n")
    prompts, how = tr.read_prompts(tmp_path / "p.txt", tokenizer=with_tok.tokenizer, vocab_size=with_tok.vocab_size)
    assert how == "tokenizer"
    assert list(prompts[0].input_ids) == with_tok.tokenizer("the lazy fox")["input_ids"]
    with pytest.raises(MoesimError, match="not a local path: the tracer has no network access"):
        tr.load_model("mistralai/Mixtral-8x7B-v0.1")
    with pytest.raises(MoesimError, match="no such model"):
        tr.load_model(tmp_path / "nope")
    with pytest.raises(MoesimError, match="unknown dtype"):
        tr.load_model(tmp_path / "tiny.json", dtype="int8")


# --------------------------------------------------------------------------------------------
# Command line


def _command_names(app: Any) -> set[str]:
    return {c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands}


def _invoke(args: list[str]) -> tuple[int, str]:
    """Run ``simctl trace record`` through sim.cli.main when traces/cli.py registers it, else
    through a one-command typer app of our own; returns (exit status, output)."""
    import typer
    from typer.testing import CliRunner

    from moesim.traces.cli import app as trace_app
    from moesim.traces.tracer.record import record

    if "record" in _command_names(trace_app):
        from moesim.sim.cli.main import main

        return main(["trace", "record", *args]), ""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("record")(record)
    app.command("noop")(lambda: None)  # two commands: "record" is then a subcommand
    result = CliRunner().invoke(app, ["record", *args])
    if isinstance(result.exception, MoesimError):
        return 2, str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.mark.tracer
def test_cli_record_writes_a_valid_trace(tr: Any, tmp_path: Path, capsys: Any) -> None:
    cfg = {"model_type": "qwen3_moe", **COMMON, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "head_dim": 8}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "p.txt").write_text("hello moe\nsecond prompt\n")
    out = tmp_path / "out.parquet"
    code, text = _invoke(["--model", str(tmp_path / "cfg.json"), "--prompts", str(tmp_path / "p.txt"),
                          "--max-new-tokens", "4", "--ignore-eos", "--seed", "1", "-o", str(out)])
    text += capsys.readouterr().out
    assert code == 0, text
    assert "2 requests" in text and "3 MoE layers x 4 experts" in text
    trace = read_trace(out)
    assert trace.meta.model.num_layers == 3 and trace.meta.model.num_experts == 4
    assert trace.meta.source["tokenization"] == "bytes"
    assert trace.meta.source["weights"] == "random (seed 1)"
    L = 3
    assert list(trace.phase[::L][: len("hello moe") + 3]) == [0] * len("hello moe") + [1] * 3
    code, _ = _invoke(["--model", str(tmp_path / "cfg.json"), "--prompts", str(tmp_path / "p.txt"),
                       "--teacher-forced", "-o", str(tmp_path / "tf.parquet")])
    assert code == 0
    assert (read_trace(tmp_path / "tf.parquet").phase == 1).all()


@pytest.mark.tracer
def test_cli_record_errors_are_one_line(tr: Any, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "p.txt").write_text("x\n")
    cases = [
        (["--model", "mistralai/Mixtral-8x7B-v0.1"], "no network access"),
        (["--model", str(tmp_path), "--teacher-forced", "--max-new-tokens", "3"], "--max-new-tokens applies"),
        (["--model", str(tmp_path), "--temperature", "0.5"], "--temperature applies only with --sample"),
        (["--model", str(tmp_path), "--columns", "logits,foo"], "unknown column 'foo'"),
        (["--model", str(tmp_path), "--device", "tpu"], "unknown device 'tpu'"),
        (["--model", str(tmp_path)], "needs a config.json"),
    ]
    for args, msg in cases:
        code, text = _invoke([*args, "--prompts", str(tmp_path / "p.txt"), "-o", str(tmp_path / "o.parquet")])
        text += capsys.readouterr().err
        assert code == 2 and msg in text, (args, text)
    assert not (tmp_path / "o.parquet").exists()


def test_record_without_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from moesim.traces.tracer.record import record

    monkeypatch.setitem(sys.modules, "torch", None)  # makes "import torch" fail
    monkeypatch.delitem(sys.modules, "moesim.traces.tracer.tracer", raising=False)
    with pytest.raises(MoesimError, match=r"needs torch and transformers \(torch is not installed\): "
                                          r"pip install 'torch==2.13.0' && pip install -e '\.\[tracer\]' in your "
                                          r"moesim checkout"):
        record(model="x", prompts=tmp_path / "p.txt", out=tmp_path / "o.parquet")


@pytest.mark.tracer
def test_recorded_trace_replays_through_simctl_run(tr: Any, tmp_path: Path, capsys: Any) -> None:
    from moesim.sim.cli.main import app, main

    if "run" not in _command_names(app):
        pytest.skip("simctl run is not there yet")
    res = tr.trace_model(build_model("mixtral"), [tr.Prompt(PROMPT), tr.Prompt((3, 1, 4, 1, 5))], name="tiny",
                         max_new_tokens=6, stop_at_eos=False)
    tr.record_trace(tmp_path / "tiny.parquet", res)
    (tmp_path / "s.yaml").write_text(
        "name: tracer-replay\ntrace: tiny.parquet\n"
        "model: {base: mixtral-8x7b, num_layers: 3, num_experts: 8, top_k: 2}\n"
        "hardware: rtx-4090\ncache: {rate: 0.5, initial: empty}\npolicy: lru\n"
        "workload: {batch_size: 1, phases: [prefill, decode], requests: all}\nseed: 0\n")
    assert main(["run", str(tmp_path / "s.yaml")]) == 0, capsys.readouterr().err
