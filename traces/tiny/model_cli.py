"""``simctl model ...``: the small MoEs trained in this repository (train one again, find it).

torch and transformers are imported inside the commands that need them, so ``simctl --help``
stays fast and ``simctl model path`` works without the ``tracer`` extra.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.install_hint import extra_hint
from moesim.sim.core.lib_warnings import quiet_library_warnings

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command("path")
def path_cmd(
    name: Annotated[str, typer.Argument(help="Bundled model: tiny-moe or fine-moe.")] = "tiny-moe",
) -> None:
    """Print the folder of a bundled trained MoE (config.json, model.safetensors, NOTICE.md)."""
    from moesim.traces.tiny.tiny_model import model_dir

    typer.echo(str(model_dir(name)))


@app.command("prompts")
def prompts_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Output JSONL file ({'text': ...} per line).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Number of prompts.")] = 16,
    length: Annotated[int, typer.Option("--bytes", min=8, help="Bytes per prompt (at most).")] = 192,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompt positions.")] = 0,
    corpus: Annotated[Path | None, typer.Option(
        "--corpus", help="Corpus folder (default: this Python's standard library).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing prompts file.")] = False,
) -> None:
    """Write prompts cut from the held-out part of the corpus (text the bundled MoEs never saw)."""
    import json

    from moesim.sim.core.atomic import atomic_file, check_target
    from moesim.traces.tiny.tiny_corpus import held_out_prompts, load_corpus

    check_target(out, option="--out", folder=False, force=force, owned=_holds_prompts)
    texts = held_out_prompts(load_corpus(corpus), n, length, seed=seed)
    with atomic_file(out, option="--out", force=force, owned=_holds_prompts) as tmp:
        tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    typer.echo(f"wrote {out}: {len(texts)} held-out prompts of at most {length} bytes")


def _holds_prompts(path: Path) -> bool:
    """True when every line of ``path`` is ``{"text": ...}``, as ``simctl model prompts`` writes."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                obj = json.loads(line)
                if not (isinstance(obj, dict) and list(obj) == ["text"] and isinstance(obj["text"], str)):
                    return False
    except (OSError, ValueError, RecursionError):
        return False
    return True


@quiet_library_warnings()
def _train_cmd(
    out: Annotated[Path, typer.Option("-o", "--out", help="Output folder (model.safetensors, "
                                      "config.json, train_log.json, NOTICE.md).")],
    preset: Annotated[str, typer.Option("--preset", help="Recipe to start from: tiny-moe (4 layers "
                                        "x 16 experts, top-2) or fine-moe (8 layers x 64 "
                                        "experts, top-8, expert FFN 32); the options below "
                                        "override its settings.")] = "tiny-moe",
    corpus: Annotated[Path | None, typer.Option(
        "--corpus", help="Folder of text to train on (*.py, *.txt, *.md, *.rst; default: this "
        "Python's standard library sources).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Optimizer steps.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the initialisation and batches.")] = None,
    layers: Annotated[int | None, typer.Option("--layers", min=1, help="MoE layers.")] = None,
    experts: Annotated[int | None, typer.Option("--experts", min=1, help="Experts per layer.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, help="Experts per token.")] = None,
    hidden: Annotated[int | None, typer.Option("--hidden", min=8, help="Hidden size.")] = None,
    intermediate: Annotated[int | None, typer.Option("--intermediate", min=1,
                                                     help="Expert FFN width.")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=8, help="Training window in bytes.")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="Windows per step.")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Peak learning rate.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="torch CPU threads (on a loaded machine 1 is faster: threads that wait for each other spin).")] = None,
    eval_windows: Annotated[int | None, typer.Option("--eval-windows", min=1,
                                                     help="Held-out windows evaluated.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (the recipe) or cuda: the same "
                                        "initial weights and batches, faster, not "
                                        "bit-identical to a CPU run.")] = "cpu",
    force: Annotated[bool, typer.Option("--force", help="Replace the --out folder of an earlier training.")] = False,
) -> None:
    """Train a small Mixtral-architecture MoE on CPU from offline text (needs the tracer extra)."""
    from moesim.sim.core.atomic import atomic_folder, check_target

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        missing = (exc.name or "torch").split(".")[0]
        raise MoesimError(f"simctl model train needs torch and transformers ({missing} is "
                          "not installed): " + extra_hint("tracer")) from None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from moesim.traces.tiny.recipe import PRESETS
    from moesim.traces.tiny.recipe import preset as recipe
    from moesim.traces.tiny.tiny_corpus import load_corpus
    from moesim.traces.tiny.train_tiny import check_device, save, train

    base = PRESETS.get(preset)
    warmup = None if base is None or steps is None else min(base.warmup, max(1, steps // 10))
    cfg = recipe(preset, num_layers=layers, num_experts=experts, top_k=top_k, hidden_size=hidden,
                 intermediate_size=intermediate, seq_len=seq_len, batch_size=batch_size,
                 steps=steps, lr=lr, warmup=warmup, seed=seed, eval_windows=eval_windows,
                 threads=threads)
    text = load_corpus(corpus)
    check_device(device)
    check_target(out, option="--out", folder=True, force=force)   # once the inputs are known good
    err = Console(stderr=True)
    err.print(f"{preset}: corpus {text.describe()}")
    tty = err.is_terminal
    total = cfg.steps
    every = max(1, total // 40)

    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(),
                  console=err, disable=not tty) as bar:
        task = bar.add_task("train", total=total, loss="-")

        def report(step: int, stats: dict[str, float]) -> None:
            bar.update(task, completed=step, loss=f"{stats['loss']:.3f}")
            if not tty and (step % every == 0 or step == total):
                print(f"step {step}/{total} loss {stats['loss']:.4f} aux {stats['aux_loss']:.4f}",
                      file=sys.stderr, flush=True)

        result = train(cfg, text, progress=report, device=device)
    verb = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "model" else ""
    command = f"simctl model {verb} " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if verb in ("train", "train-tiny") else f"simctl model train --preset {preset} -o {out}"
    with atomic_folder(out, option="--out", force=force, kind="model") as tmp:
        save(result, tmp, command=command, name=preset)
    log = result.log()
    typer.echo(f"wrote {out}: held-out loss {log['held_out_loss']:.3f} nats/byte (perplexity "
               f"{log['held_out_perplexity']:.2f}; random weights {log['random_model_held_out_loss']:.3f}), "
               f"final train loss {log['final_train_loss']:.3f}, {log['wall_s']:.0f} s")


app.command("train")(_train_cmd)
app.command("train-tiny", help="The same as train (kept for older scripts): --preset tiny-moe "
            "unless given.")(_train_cmd)
