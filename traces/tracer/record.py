"""``simctl trace record``: run prompts through a local Hugging Face MoE model and write a
moe-trace file (see :mod:`traces.tracer` for what is recorded and how).

torch and transformers are imported inside :func:`record` only, so the rest of the CLI works
without the ``tracer`` extra; without it, the command fails with a one-line error.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from moesim.sim.core.atomic import check_target
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.install_hint import extra_hint
from moesim.sim.core.lib_warnings import quiet_library_warnings

_COLUMNS = ("weights", "logits", "lookahead_logits", "token_id", "embedding")


def _parse_columns(text: str) -> frozenset[str]:
    if text.strip() == "all":
        return frozenset(_COLUMNS)
    if text.strip() == "none":
        return frozenset()
    cols = frozenset(c.strip() for c in text.split(",") if c.strip())
    unknown = sorted(cols - set(_COLUMNS))
    if unknown:
        raise MoesimError(f"--columns: unknown column {unknown[0]!r} (expected all, none or a "
                          f"comma-separated subset of {', '.join(_COLUMNS)})")
    return cols


_SIZE_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
              "num_local_experts", "num_experts", "num_experts_per_tok", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "head_dim")


def _check_config(model: str) -> None:
    """A config given as JSON (a file, or config.json in a folder) must have positive integer
    sizes: torch would fail deep inside with a message that names no field."""
    p = Path(model)
    cfg = p / "config.json" if p.is_dir() else p
    if not (cfg.is_file() and cfg.suffix == ".json"):
        return
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MoesimError(f"{cfg}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise MoesimError(f"{cfg}: a model config must be a JSON object")
    for key in _SIZE_KEYS:
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise MoesimError(f"{cfg}: {key}: must be a positive integer, got {v!r}")


@quiet_library_warnings()
def record(
    model: Annotated[str, typer.Option(
        "--model", help="Local HF model directory, or a config (a directory with config.json "
        "and no weights, or a JSON file with 'model_type') built with random weights. "
        "Never downloaded.")],
    prompts: Annotated[Path, typer.Option(
        "--prompts", help="Prompts file: plain text, one prompt per line; or *.jsonl with "
        "'text' or 'input_ids' (and, for --teacher-forced, optional 'completion' or "
        "'completion_ids'). Without a tokenizer, text is tokenised as UTF-8 bytes.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Output moe-trace Parquet file.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output file.")] = False,
    max_new_tokens: Annotated[int | None, typer.Option(
        "--max-new-tokens", min=0, help="Tokens to generate per prompt (default 32); N tokens "
        "take N-1 decode iterations. Generation mode only.")] = None,
    teacher_forced: Annotated[bool, typer.Option(
        "--teacher-forced", help="Run each text in one forward instead of generating: a "
        "completion's tokens become decode rows after a prefill of the prompt; a text without "
        "completion is recorded as decode rows only.")] = False,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on "
        "CUDA).")] = None,
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed of the random weights (config models) and of sampling.")] = 0,
    sample: Annotated[bool, typer.Option(
        "--sample/--greedy", help="Sample next tokens (per-request generator seeded from "
        "--seed and the request index) or take the argmax.")] = False,
    temperature: Annotated[float | None, typer.Option(
        "--temperature", help="Sampling temperature (with --sample; default 1.0).")] = None,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos", help="Always generate --max-new-tokens, even past an EOS token.")] = False,
    columns: Annotated[str, typer.Option(
        "--columns", help="Optional columns to record: all, none, or a comma-separated subset "
        f"of {', '.join(_COLUMNS)}.")] = "all",
) -> None:
    """Record a moe-trace from a local Hugging Face MoE model (needs the tracer extra)."""
    cols = _parse_columns(columns)
    if teacher_forced:
        if max_new_tokens is not None:
            raise MoesimError("--max-new-tokens applies to generation, not --teacher-forced")
        if sample or temperature is not None or ignore_eos:
            raise MoesimError("--sample, --temperature and --ignore-eos apply to generation, "
                              "not --teacher-forced")
    elif temperature is not None and not sample:
        raise MoesimError("--temperature applies only with --sample")
    if temperature is not None and temperature <= 0:
        raise MoesimError(f"--temperature must be > 0, got {temperature}")
    # the hub library reads this at import: no download can start, whatever the cache holds
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        missing = (exc.name or "torch").split(".")[0]
        raise MoesimError(f"simctl trace record needs torch and transformers ({missing} is not "
                          "installed): " + extra_hint("tracer", torch=True) + " (a pinned torch; "
                          "an unpinned one pulls a CUDA build of several GB)") from None
    if not prompts.is_file():
        raise MoesimError(f"--prompts {prompts}: no such file")
    check_target(out, option="-o", folder=False, force=force)
    _check_config(model)
    from rich.console import Console
    from rich.progress import Progress

    from moesim.traces.tracer import tracer
    from moesim.traces.tracer.model_loading import load_model
    from moesim.traces.tracer.prompts import read_prompts

    transformers.utils.logging.set_verbosity_error()
    t0 = time.perf_counter()
    loaded = load_model(model, device=device, dtype=dtype, seed=seed)
    items, tokenization = read_prompts(prompts, tokenizer=loaded.tokenizer,
                                       vocab_size=loaded.vocab_size)
    with Progress(transient=True, console=Console(stderr=True), disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("tracing", total=len(items))
        result = tracer.trace_model(
            loaded.model, items, name=loaded.name, teacher_forced=teacher_forced,
            max_new_tokens=32 if max_new_tokens is None else max_new_tokens, sample=sample,
            temperature=1.0 if temperature is None else temperature, seed=seed,
            stop_at_eos=not ignore_eos, columns=cols,
            progress=lambda i: bar.update(task, completed=i + 1),
        )
    extra = {**loaded.source, "prompts": Path(prompts).name, "tokenization": tokenization,
             "num_requests": len(items)}
    path = tracer.record_trace(out, result, extra_source=extra)
    phase = result.columns["phase"][:: result.model.num_layers]
    n_tok = int(phase.shape[0])
    n_pre = int((phase == 0).sum())
    m = result.model
    typer.echo(f"wrote {path}: {len(items)} requests, {n_tok} tokens ({n_pre} prefill, "
               f"{n_tok - n_pre} decode), {m.num_layers} MoE layers x {m.num_experts} experts, "
               f"top-{m.top_k}, {result.num_rows} rows in {time.perf_counter() - t0:.1f} s")
