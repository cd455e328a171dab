"""Loading a model for the tracer: a local transformers model directory or a config file.

:func:`load_model` loads local weights, or builds the model from its config with seeded
random weights; nothing is downloaded. :func:`resolve_device` and :func:`resolve_dtype`
turn the ``--device`` / ``--dtype`` options into torch objects (one-line errors otherwise).

Imports torch at import time (transformers lazily): import this module lazily.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.lib_warnings import quiet_library_warnings


@dataclass
class LoadedModel:
    """A model ready to trace, its tokenizer (None when it has none), and provenance."""

    model: nn.Module
    tokenizer: Any | None
    name: str
    vocab_size: int
    source: dict[str, Any]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; a missing GPU is a one-line error."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise MoesimError(f"unknown device {device!r} (expected cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MoesimError(f"device {device!r} asked for, but this torch build sees no CUDA GPU")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """``None`` means float32 on CPU, bfloat16 on CUDA."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise MoesimError(f"unknown dtype {dtype!r} (expected {', '.join(DTYPES)})")
    return DTYPES[dtype]


@quiet_library_warnings()
def load_model(spec: str | Path, *, device: str = "cpu", dtype: str | None = None, seed: int = 0) -> LoadedModel:
    """Load a local model directory, or build one with random weights from a config.

    ``spec`` is a directory with ``config.json`` (and weights: loaded; without weights: the
    model is built from the config with random weights seeded by ``seed``), or a config JSON
    file (random weights). Nothing is downloaded: a non-local ``spec`` is an error.
    """
    import transformers

    path = Path(spec)
    if not path.exists():
        if _HUB_ID.match(str(spec)):
            raise MoesimError(f"model {str(spec)!r} is not a local path: the tracer has no network "
                              "access, download the model first and pass its local directory")
        raise MoesimError(f"{spec}: no such model directory or config file")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    src: dict[str, Any] = {"model_path": str(spec)}
    model: Any
    try:
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise MoesimError(f"{path}: a model directory needs a config.json")
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            has_weights = any((path / f).is_file() for f in _WEIGHT_FILES) or any(path.glob("*.safetensors"))
            name = path.resolve().name
        else:
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise MoesimError(f"{path}: not a JSON config ({exc})") from None
            if not isinstance(raw, dict) or "model_type" not in raw:
                raise MoesimError(f"{path}: a config JSON needs a 'model_type'")
            model_type = raw.pop("model_type")
            try:
                config = transformers.AutoConfig.for_model(model_type, **raw)
            except ValueError as exc:
                raise MoesimError(f"{path}: {str(exc).splitlines()[0]}") from None
            has_weights = False
            name = path.stem
        if has_weights:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=dt, local_files_only=True)
            src["weights"] = "pretrained"
        else:
            # seeded init on the target device, without touching the global RNG state
            rng_devices = [dev.index or 0] if dev.type == "cuda" else []
            with torch.random.fork_rng(devices=rng_devices), dev:
                torch.manual_seed(seed)
                model = transformers.AutoModelForCausalLM.from_config(config, dtype=dt)
            src["weights"] = f"random (seed {seed})"
    except MoesimError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MoesimError(f"{spec}: cannot build the model ({first})") from None
    model = model.to(dev).eval()
    tokenizer = None
    if path.is_dir() and any((path / f).is_file() for f in _TOKENIZER_FILES):
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise MoesimError(f"{path}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
    vocab = int(getattr(model.config, "vocab_size", 0) or model.get_input_embeddings().weight.shape[0])
    src.update(model_type=getattr(model.config, "model_type", "?"))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, vocab_size=vocab, source=src)
