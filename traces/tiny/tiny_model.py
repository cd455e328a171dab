"""Where the bundled small MoEs and their traces live (package data; no torch needed).

Two models were trained in this repository by ``simctl model train`` (:mod:`.train_tiny`,
recipes in :mod:`.recipe`) on the Python standard library's sources, byte vocabulary, Hugging
Face Mixtral architecture: ``tiny-moe`` (4 MoE layers x 16 experts, top-2, hidden 128) and
``fine-moe`` (8 MoE layers x 64 fine-grained experts, top-8, expert FFN 32). They are real
models with learned routing for offline work (tracing, prefetchers on real router logits, the
CPU executor, quality checks), not stand-ins for a large model's numbers. Each folder holds
``config.json``, ``model.safetensors`` (float16), ``generation_config.json``,
``train_log.json`` and ``NOTICE.md``; load one with
``transformers.AutoModelForCausalLM.from_pretrained(model_dir(name))`` or
``moesim.traces.tracer.model_loading.load_model(model_dir(name))``.
"""

from __future__ import annotations

from pathlib import Path

from moesim.sim.core.errors import MoesimError

NAME = "tiny-moe"
"""The catalog name of the tiny model (``sim/config/catalog/models.yaml``) and of its folder."""
FINE_NAME = "fine-moe"
"""The catalog name of the fine-grained model and of its folder."""
BUNDLED = (NAME, FINE_NAME)
"""Every bundled trained model, by catalog name."""

_SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _known(name: str) -> str:
    if name not in BUNDLED:
        raise MoesimError(f"model {name!r}: not a bundled trained model (bundled: {', '.join(BUNDLED)})")
    return name


def model_dir(name: str = NAME) -> Path:
    """The folder of the bundled model ``name`` (a Hugging Face model directory).

    Raises :class:`MoesimError` for an unknown name, or if the installation lacks the folder
    (a package built without its data files)."""
    path = _SAMPLES / _known(name)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise MoesimError(f"{path}: the bundled {name} is missing (config.json and "
                          "model.safetensors); reinstall moesim or train one with "
                          f"simctl model train --preset {name}")
    return path


def trace_path(name: str = NAME) -> Path:
    """The bundled trace recorded from the model ``name`` on held-out text (``<name>.parquet``)."""
    path = _SAMPLES / f"{_known(name)}.parquet"
    if not path.is_file():
        raise MoesimError(f"{path}: the bundled {name} trace is missing; reinstall moesim")
    return path
