"""``simctl quality``: a lossy policy's plans run on a real model, compared with the unmodified
model (KL divergence, next-token agreement, perplexity; see :mod:`traces.quality`).

torch and transformers are imported when the command runs, so the rest of the CLI works
without the ``tracer`` extra; without it, the command fails with a one-line error.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.install_hint import extra_hint
from moesim.sim.core.lib_warnings import quiet_library_warnings


def _params(items: list[str] | None) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise MoesimError(f"--param {item!r}: expected NAME=VALUE")
        out[key.strip()] = yaml.safe_load(val)
    return out


def _held_out_texts(n: int, seed: int) -> Path:
    """A JSONL file (in a fresh temporary folder) of ``n`` prompts of 256 bytes cut from the tiny
    MoE's held-out text (stdlib files it never trained on; ``simctl model prompts`` writes the same)."""
    import tempfile

    from moesim.traces.tiny.tiny_corpus import held_out_prompts, load_corpus

    lines = [json.dumps({"text": t}) for t in held_out_prompts(load_corpus(), n, 256, seed=seed)]
    path = Path(tempfile.mkdtemp(prefix="moesim-quality-")) / "held-out.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@quiet_library_warnings()
def quality(
    model: Annotated[str | None, typer.Option(
        "--model", help="Local HF model directory (weights loaded) or a config (random weights). "
        "Never downloaded. Default: the bundled tiny MoE (`simctl model path`).")] = None,
    texts: Annotated[Path | None, typer.Option(
        "--texts", help="Held-out texts, in the format of `simctl trace record --prompts` (plain "
        "text lines or *.jsonl); a completion is appended to its prompt. Default (tiny MoE only): "
        "--default-texts prompts cut from its held-out text.")] = None,
    default_texts: Annotated[int, typer.Option(
        "--default-texts", min=2, help="How many held-out texts to cut when --texts is not given.")] = 12,
    policy: Annotated[str, typer.Option("--policy", help="Registered policy whose plans run.")] = "commitmoe",
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Policy parameter NAME=VALUE (YAML value; repeatable).")] = None,
    profile_texts: Annotated[int, typer.Option(
        "--profile-texts", min=0, help="The first N texts are the profile split (never evaluated).")] = 0,
    cache_rate: Annotated[float, typer.Option(
        "--cache-rate", help="Expert budget of the simulated replay, as a share of all experts.")] = 0.25,
    hardware: Annotated[str, typer.Option("--hardware", help="Hardware catalog name of the replay.")] = "rtx-4090",
    seed: Annotated[int, typer.Option("--seed", help="Seed of random weights and of the replay.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run a lossy policy's plans on a real model and report KL, agreement and perplexity."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        missing = (exc.name or "torch").split(".")[0]
        raise MoesimError(f"simctl quality needs torch and transformers ({missing} is not installed): "
                          + extra_hint("tracer")) from None
    from moesim.sim.real.quality import evaluate_plans
    from moesim.traces.tiny import tiny_model
    from moesim.traces.tracer.model_loading import load_model
    from moesim.traces.tracer.prompts import read_prompts

    transformers.utils.logging.set_verbosity_error()
    if model is None:
        model = str(tiny_model.model_dir())
    if texts is None:
        if Path(model).resolve() != tiny_model.model_dir().resolve():
            raise MoesimError("simctl quality: --texts is needed for a model other than the bundled tiny MoE")
        texts = _held_out_texts(default_texts, seed)
        try:
            loaded = load_model(model, seed=seed)
            items, tokenization = read_prompts(texts, tokenizer=loaded.tokenizer, vocab_size=loaded.vocab_size)
        finally:
            shutil.rmtree(texts.parent, ignore_errors=True)
    else:
        loaded = load_model(model, seed=seed)
        items, tokenization = read_prompts(texts, tokenizer=loaded.tokenizer, vocab_size=loaded.vocab_size)
    ids = [list(p.input_ids) + list(p.completion_ids or ()) for p in items]
    res = evaluate_plans(loaded.model, ids, policy, params=_params(param), profile_texts=profile_texts,
                         hardware=hardware, cache_rate=cache_rate, seed=seed)
    if json_out:
        typer.echo(json.dumps({**res.as_dict(), "model": loaded.source, "tokenization": tokenization}, indent=2))
        return
    typer.echo(f"{res.policy} on {loaded.name} ({loaded.source.get('weights', '?')} weights): {res.texts} texts, "
               f"{res.tokens} positions, plan applied to {res.planned_token_layers:.1%} of token-layers")
    typer.echo(f"  KL(ref || plan) {res.kl:.5f} nats/token, next-token agreement {res.agreement:.3f}, "
               f"perplexity {res.ppl_ref:.3f} -> {res.ppl_plan:.3f} ({res.ppl_delta:+.3f})")
    sim = res.sim
    if "routing_mass_kept" in sim:
        typer.echo(f"  simulator: routing mass kept {sim['routing_mass_kept']:.3f}, substitutions/token "
                   f"{sim['substitutions_per_token']:.2f}, dropped/token {sim['dropped_per_token']:.2f}")
    if sim.get("policy_report"):
        typer.echo("  policy: " + ", ".join(f"{k} {v}" for k, v in sim["policy_report"].items()))
    for w in sim.get("warnings", []):
        typer.echo(f"  warning: {w}")
