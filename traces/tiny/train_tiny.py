"""Train the small MoEs of this repository (tiny-moe, fine-moe: recipes in :mod:`.recipe`): a
Mixtral-architecture causal LM learned on CPU from offline text (extra ``tracer``: imports
torch and transformers).

The model is a Hugging Face ``MixtralForCausalLM`` (config and modeling code of transformers),
so the tracer, the executor and any HF tool load it as they load Mixtral. It reads bytes
(:mod:`.tiny_corpus`: ids 0..255, 256 = end of file). The loss is the next-token
cross-entropy plus ``router_aux_loss_coef`` times the router's load-balancing loss, computed by
transformers' own Mixtral code (``output_router_logits=True``: Switch Transformer's loss,
Fedus et al. 2022, Eqs. 4-6, summed over the MoE layers).

Training is deterministic for a fixed seed on a fixed corpus, thread count and torch build:
the weights' initialisation and every batch's window offsets come from ``torch.manual_seed``
and a ``torch.Generator`` seeded with the seed. AdamW, linear warm-up then cosine decay to a
tenth of the peak rate, gradients clipped to norm 1.

:func:`train` returns (and :func:`save` writes next to the weights as ``train_log.json``) the
final train loss, the held-out loss and perplexity of the saved (float16) weights, the same
for a random-weight model of the same shape, and :func:`routing_summary` of both on held-out
text: evidence that the routing is learned, not noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.lib_warnings import quiet_library_warnings
from moesim.traces.tiny.recipe import TinyConfig
from moesim.traces.tiny.tiny_corpus import EOS_ID, VOCAB_SIZE, Corpus, stdlib_root

__all__ = ["TinyConfig", "TrainResult", "build_model", "eval_starts", "evaluate", "hardware",
           "hf_config", "notice", "routing_summary", "save", "train"]


def hf_config(cfg: TinyConfig) -> Any:
    """The ``MixtralConfig`` of ``cfg`` (byte vocabulary, EOS = 256, untied head)."""
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=VOCAB_SIZE, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, num_local_experts=cfg.num_experts,
        num_experts_per_tok=cfg.top_k, max_position_embeddings=max(512, cfg.seq_len),
        router_aux_loss_coef=cfg.router_aux_loss_coef, router_jitter_noise=0.0,
        output_router_logits=False, tie_word_embeddings=False,
        bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
    )


def build_model(cfg: TinyConfig, seed: int | None = None) -> Any:
    """A freshly initialised (random-weight) ``MixtralForCausalLM`` of ``cfg``'s shape."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        model = transformers.MixtralForCausalLM(hf_config(cfg))
    return model.float()


def _lr_at(cfg: TinyConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def _windows(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    idx = starts[:, None] + torch.arange(length)[None, :]
    return stream[idx]


def eval_starts(stream_len: int, seq_len: int, n: int) -> torch.Tensor:
    """``n`` evenly spaced window starts over a stream (deterministic, no RNG)."""
    if stream_len < seq_len + 2:
        raise MoesimError(f"held-out text has {stream_len} tokens, fewer than one window of "
                          f"{seq_len + 1}: use a larger corpus or a shorter --seq-len")
    last = stream_len - seq_len - 1
    return torch.linspace(0, last, n).round().long().unique()


@torch.no_grad()
def evaluate(model: Any, stream: torch.Tensor, seq_len: int, n_windows: int) -> float:
    """Mean next-token cross-entropy (nats per byte, no auxiliary loss) of ``model`` on
    ``n_windows`` evenly spaced windows of ``stream``."""
    model.eval()
    starts = eval_starts(int(stream.numel()), seq_len, n_windows)
    total, count = 0.0, 0
    for chunk in starts.split(16):
        w = _windows(stream, chunk, seq_len + 1)
        logits = model(input_ids=w[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                               reduction="sum")
        total += float(loss)
        count += int(w[:, 1:].numel())
    return total / count


@torch.no_grad()
def routing_summary(model: Any, ids: torch.Tensor) -> list[dict[str, float]]:
    """Per MoE layer, on the token sequence ``ids`` (1-D): how the router routes.

    ``token_entropy``: mean entropy of the router's softmax over E, divided by ln E (1 =
    uniform, a router that cannot tell experts apart); ``top1_prob``: mean top-1 probability;
    ``usage_entropy``: entropy of the experts' share of the top-k selections / ln E (1 =
    perfectly balanced); ``reuse``: mean fraction of a token's top-k also chosen by the
    previous token in the same layer (k/E for independent uniform routing).
    """
    model.eval()
    out = model(input_ids=ids[None, :], output_router_logits=True)
    rows = []
    for logits in out.router_logits:
        p = logits.float().softmax(dim=-1)
        e = p.shape[-1]
        k = int(model.config.num_experts_per_tok)
        ent = -(p * p.clamp_min(1e-12).log()).sum(-1) / math.log(e)
        top = p.topk(k, dim=-1).indices
        share = torch.bincount(top.reshape(-1), minlength=e).float()
        share = share / share.sum()
        usage = -(share * share.clamp_min(1e-12).log()).sum() / math.log(e)
        prev, cur = top[:-1], top[1:]
        reuse = (cur[:, :, None] == prev[:, None, :]).any(-1).float().mean()
        rows.append({"token_entropy": round(float(ent.mean()), 4),
                     "top1_prob": round(float(p.max(-1).values.mean()), 4),
                     "usage_entropy": round(float(usage), 4), "reuse": round(float(reuse), 4)})
    return rows


@dataclass
class TrainResult:
    """What :func:`train` measured; :meth:`log` is the ``train_log.json`` content."""

    config: TinyConfig
    model: Any
    history: list[dict[str, float]]
    final_train_loss: float
    held_out_loss: float
    random_held_out_loss: float
    routing: list[dict[str, float]]
    random_routing: list[dict[str, float]]
    wall_s: float
    corpus: str
    corpus_digest: str
    device: str = "cpu"
    hardware: str = ""
    experts_implementation: str = ""

    def log(self) -> dict[str, Any]:
        """JSON-ready summary (losses in nats per byte; perplexity = exp(loss))."""
        return {
            "config": asdict(self.config),
            "corpus": self.corpus,
            "corpus_sha256": self.corpus_digest,
            "final_train_loss": round(self.final_train_loss, 4),
            "held_out_loss": round(self.held_out_loss, 4),
            "held_out_perplexity": round(math.exp(self.held_out_loss), 3),
            "random_model_held_out_loss": round(self.random_held_out_loss, 4),
            "random_model_held_out_perplexity": round(math.exp(self.random_held_out_loss), 3),
            "routing_trained": self.routing,
            "routing_random_weights": self.random_routing,
            "wall_s": round(self.wall_s, 1),
            "device": self.device,
            "hardware": self.hardware,
            "experts_implementation": self.experts_implementation,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "history": self.history,
        }


def check_device(device: str) -> torch.device:
    """The torch device ``--device`` names (``cpu``, ``cuda`` or ``cuda:N``), or one line saying
    why it cannot be used here."""
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):
        raise MoesimError(f"--device {device}: expected cpu, cuda or cuda:N")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise MoesimError(f"--device {device}: torch sees no CUDA device here")
    return dev


def hardware(device: str, threads: int) -> str:
    """One line naming where a model trains: the GPU's name, or the CPU and its thread count."""
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in info.read_text(errors="replace").splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    return f"CPU {cpu}, {threads} torch thread(s) of {os.cpu_count()} logical cores"


@quiet_library_warnings()
def train(cfg: TinyConfig, corpus: Corpus, *, progress: Callable[[int, dict[str, float]], None] | None = None,
          log_every: int = 50, device: str = "cpu", experts_implementation: str | None = None) -> TrainResult:
    """Train a tiny MoE of ``cfg`` on ``corpus``; ``progress(step, stats)`` after every step.

    ``device``: ``"cpu"`` (the recipe) or a CUDA device (``"cuda"``) to go faster. Either way
    the initial weights and every batch are those of the CPU recipe (drawn on the CPU from the
    seed); on a GPU the arithmetic differs, so the weights are not bit-identical to a CPU run's.
    ``experts_implementation`` names transformers' expert kernels for training (``eager``,
    ``batched_mm``, ``grouped_mm``); None keeps transformers' default on the CPU (the recipe)
    and takes ``batched_mm`` on a GPU (``grouped_mm`` wants bfloat16 there). The held-out loss
    and routing are measured on the CPU on the weights as :func:`save` stores them (rounded to
    float16), so they are the shipped model's figures.
    """
    dev = check_device(device)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    train_stream = torch.from_numpy(corpus.train.astype(np.int64))
    held_stream = torch.from_numpy(corpus.held_out.astype(np.int64))
    n = int(train_stream.numel())
    if n < cfg.seq_len + 2:
        raise MoesimError(f"training text has {n} tokens, fewer than one window of "
                          f"{cfg.seq_len + 1}: use a larger corpus or a shorter --seq-len")
    model = build_model(cfg)
    impl = str(getattr(model.config, "_experts_implementation", "eager"))
    if dev.type == "cuda":
        model.to(dev)
    chosen = experts_implementation or ("batched_mm" if dev.type == "cuda" else None)
    if chosen is not None and chosen != impl:
        model.set_experts_implementation(chosen)
    used_impl = str(getattr(model.config, "_experts_implementation", "eager"))
    model.train()
    decay = [p for name, p in model.named_parameters() if p.dim() >= 2 and "embed" not in name]
    no_decay = [p for name, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in name)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict[str, float]] = []
    ema: float | None = None
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = _lr_at(cfg, step)
        starts = torch.randint(0, n - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        w = _windows(train_stream, starts, cfg.seq_len + 1).to(dev)
        # no labels: the model's aux_loss comes with output_router_logits; the cross-entropy
        # is taken here so that every window scores all its seq_len next tokens
        out = model(input_ids=w[:, :-1], output_router_logits=True)
        ce = F.cross_entropy(out.logits.float().reshape(-1, VOCAB_SIZE), w[:, 1:].reshape(-1))
        aux = out.aux_loss
        loss = ce + cfg.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ce_v = float(ce.detach())
        ema = ce_v if ema is None else 0.98 * ema + 0.02 * ce_v
        stats = {"step": step + 1, "loss": round(ce_v, 4), "aux_loss": round(float(aux.detach()), 4),
                 "lr": _lr_at(cfg, step)}
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            history.append({**stats, "loss_ema": round(ema, 4),
                            "elapsed_s": round(time.perf_counter() - t0, 1)})
        if progress is not None:
            progress(step + 1, stats)
    final_train = float(ema if ema is not None else float("nan"))
    if dev.type != "cpu":
        model.to("cpu")
    if used_impl != impl:
        model.set_experts_implementation(impl)
    model = model.half().float()  # the saved precision
    model.eval()
    held = evaluate(model, held_stream, cfg.seq_len, cfg.eval_windows)
    probe = held_stream[: min(int(held_stream.numel()), 2048)]
    routing = routing_summary(model, probe)
    rand = build_model(cfg)
    rand_held = evaluate(rand, held_stream, cfg.seq_len, cfg.eval_windows)
    rand_routing = routing_summary(rand, probe)
    return TrainResult(config=cfg, model=model, history=history, final_train_loss=final_train,
                       held_out_loss=held, random_held_out_loss=rand_held, routing=routing,
                       random_routing=rand_routing, wall_s=time.perf_counter() - t0,
                       corpus=corpus.describe(), corpus_digest=corpus.digest, device=str(dev),
                       hardware=hardware(str(dev), cfg.threads), experts_implementation=used_impl)


def save(result: TrainResult, out: str | Path, *, command: str, name: str = "tiny-moe") -> Path:
    """Write the model (float16 safetensors + config.json + generation_config.json),
    ``train_log.json`` and a ``NOTICE.md`` (data, command, seed, losses, the SHA-256 of
    ``model.safetensors``) to the folder ``out``; ``name`` titles the NOTICE."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    model = result.model.half()
    model.save_pretrained(path, safe_serialization=True)
    result.model = model.float()
    log = result.log()
    log["name"] = name
    log["command"] = command
    log["weights_sha256"] = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    (path / "train_log.json").write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    (path / "NOTICE.md").write_text(notice(log), encoding="utf-8")
    return path


def notice(log: dict[str, Any]) -> str:
    """The model folder's NOTICE.md: what it is, what it learned from, how, and how well."""
    c = log["config"]
    stdlib = ""
    if str(log["corpus"]).startswith(str(stdlib_root()) + ":"):
        stdlib = (f" (the Python {log['python']} standard library's `*.py` sources, code and "
                  "docstrings, without site-packages and test suites)")
    routing = "\n".join(
        f"| {i} | {t['token_entropy']:.3f} | {r['token_entropy']:.3f} | {t['top1_prob']:.3f} | "
        f"{r['top1_prob']:.3f} | {t['usage_entropy']:.3f} | {t['reuse']:.3f} | {r['reuse']:.3f} |"
        for i, (t, r) in enumerate(zip(log["routing_trained"], log["routing_random_weights"], strict=True)))
    where = f"{log['wall_s']:.0f} s wall on {log.get('hardware') or 'this machine'}"
    digest = f"\n- SHA-256 of model.safetensors: `{log['weights_sha256']}`." if "weights_sha256" in log else ""
    return f"""# {log.get('name', 'tiny-moe')}: a small Mixtral-architecture MoE trained in this repository

A byte-level causal language model with the Hugging Face Mixtral architecture
(`MixtralForCausalLM`): {c['num_layers']} MoE layers x {c['num_experts']} experts, top-{c['top_k']},
hidden {c['hidden_size']}, expert FFN {c['intermediate_size']}, {c['num_heads']} attention heads /
{c['num_kv_heads']} KV heads, vocabulary 257 (bytes 0-255, 256 = end of file), weights stored
as float16. It is a small real model with learned routing, made so that everything in moesim
(tracing, prefetchers reading router logits, the executor, quality checks) has a model to run
offline. It is **not** a stand-in for a large model's numbers: its routing statistics are its
own.

- Trained on: {log['corpus']}{stdlib}; one file in 10 held out by a hash of its
  path (`moesim.traces.tiny.tiny_corpus`).
- Command: `{log['command']}`
- Seed: {c['seed']}; {c['steps']} steps of {c['batch_size']} x {c['seq_len']} bytes, AdamW (peak lr
  {c['lr']}, {c['warmup']} warm-up steps, cosine to a tenth), load-balancing loss coefficient
  {c['router_aux_loss_coef']}; torch {log['torch']}; {where}.{digest}
- Final train loss (EMA over steps): {log['final_train_loss']:.3f} nats/byte.
- Held-out loss: {log['held_out_loss']:.3f} nats/byte (perplexity {log['held_out_perplexity']:.2f}),
  measured on the float16 weights; a random-weight model of the same shape:
  {log['random_model_held_out_loss']:.3f} (perplexity {log['random_model_held_out_perplexity']:.1f}).

Routing on 2048 held-out bytes, trained vs random weights (entropy / ln E; reuse = share of a
token's top-k also chosen by the previous token in the layer):

| layer | token entropy | random | top-1 prob | random | usage entropy | reuse | random reuse |
| --- | --- | --- | --- | --- | --- | --- | --- |
{routing}

`train_log.json` holds the full log. License: the weights are a product of this repository
(Apache-2.0); the default training text is the Python standard library (PSF License).
"""
