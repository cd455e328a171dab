"""Where the bundled tiny MoE and its trace live (package data; no torch needed).

The tiny MoE is a small Mixtral-architecture causal LM trained in this repository by
``simctl model train-tiny`` (:mod:`.train_tiny`) on the Python standard library's sources: 4 MoE
layers x 16 experts, top-2, hidden 128, byte vocabulary. It is a real model with learned
routing for offline work (tracing, prefetchers on real router logits, the CPU executor,
quality checks), not a stand-in for a large model's numbers. Its folder holds
``config.json``, ``model.safetensors`` (float16), ``generation_config.json``,
``train_log.json`` and ``NOTICE.md``; load it with
``transformers.AutoModelForCausalLM.from_pretrained(model_dir())`` or
``moesim.traces.tracer.model_loading.load_model(model_dir())``.
"""

from __future__ import annotations

from pathlib import Path

from moesim.sim.core.errors import MoesimError

NAME = "tiny-moe"
"""The catalog name of the model (``sim/config/catalog/models.yaml``) and of its folder."""

_SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def model_dir() -> Path:
    """The folder of the bundled tiny MoE (a Hugging Face model directory).

    Raises :class:`MoesimError` if the installation lacks it (a package built without its
    data files)."""
    path = _SAMPLES / NAME
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise MoesimError(f"{path}: the bundled tiny MoE is missing (config.json and "
                          "model.safetensors); reinstall moesim or train one with "
                          "simctl model train-tiny")
    return path


def trace_path() -> Path:
    """The bundled trace recorded from the tiny MoE on held-out text (``tiny-moe.parquet``)."""
    path = _SAMPLES / f"{NAME}.parquet"
    if not path.is_file():
        raise MoesimError(f"{path}: the bundled tiny-moe trace is missing; reinstall moesim")
    return path
