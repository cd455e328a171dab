"""The model the executor runs: a Hugging Face Mixtral-architecture model, loaded from a local
directory / config JSON through the tracer's :func:`load_model` (by default the bundled tiny MoE
trained in this repository, catalog ``tiny-moe``: :func:`model_argument`), or built with random
weights from a :class:`~moesim.sim.config.catalog.ModelSpec` (timing does not depend on the values).

:func:`prepare` takes the routed experts out of the model into a host pool (flat weights, see
:mod:`.kernels`) and puts an :class:`OffloadedMoe` in place of each MoE block. That block
computes the real router logits, then hands the layer to a driver (the executor or a
calibration benchmark), which decides where the expert weights come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from moesim.sim.config.catalog import ModelSpec, get_model
from moesim.sim.core.errors import MoesimError

DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
DTYPE_OF = {4: torch.float32, 2: torch.bfloat16}


class Driver(Protocol):
    """Who computes a MoE layer: ``moe(layer, x [n, H], router_logits [n, E]) -> [n, H]``."""

    def moe(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The MoE output of ``layer`` for the tokens ``x``."""
        ...

    def before_layer(self, layer: int) -> None:
        """Called before the decoder layer that holds MoE layer ``layer`` runs."""
        ...


class OffloadedMoe(nn.Module):
    """Stands in for a Mixtral ``SparseMoeBlock``: the router runs here (it is part of the
    non-MoE work), the experts run wherever the driver keeps them."""

    def __init__(self, router: nn.Module, index: int, hidden: int) -> None:
        super().__init__()
        self.gate = router
        self.index = index
        self.hidden = hidden
        self.driver: Driver | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Router logits, then the driver's expert computation."""
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden)
        weight: Any = self.gate.weight
        logits = F.linear(x, weight)
        assert self.driver is not None, "OffloadedMoe has no driver"
        return self.driver.moe(self.index, x, logits).reshape(shape)


@dataclass
class OffloadModel:
    """A prepared model: the HF module (experts removed), the host expert weights per MoE layer
    (``[E, 3*H*I]``), its shape as a :class:`ModelSpec`, and where it came from."""

    model: nn.Module
    blocks: list[OffloadedMoe]
    host_experts: list[torch.Tensor]
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    hidden: int
    inter: int
    vocab_size: int
    source: dict[str, Any] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)

    def attach(self, driver: Driver) -> None:
        """Route every MoE layer (and every pre-layer hook) to ``driver``."""
        for b in self.blocks:
            b.driver = driver
        for h in self.hooks:
            h.remove()
        self.hooks = []
        for b in self.blocks:
            dec: Any = b.decoder_layer
            self.hooks.append(dec.register_forward_pre_hook(
                lambda mod, args, _i=b.index: driver.before_layer(_i)))


def _heads(hidden: int) -> tuple[int, int]:
    """Attention heads and KV heads for a random model of width ``hidden`` (head_dim 64 where
    it divides, as Mixtral; 4 KV groups as Mixtral's 32/8)."""
    for hd in (128, 64, 32, 16, 8):
        if hidden % hd == 0 and hidden // hd >= 1:
            heads = hidden // hd
            break
    else:
        heads = 1
    kv = heads // 4 if heads % 4 == 0 else heads
    return heads, max(1, kv)


def mixtral_config(spec: ModelSpec, *, vocab_size: int = 1024, max_positions: int = 4096) -> Any:
    """A MixtralConfig with the shape of ``spec`` (random weights; timing only)."""
    from transformers import MixtralConfig

    heads, kv = _heads(spec.hidden_size)
    return MixtralConfig(vocab_size=vocab_size, hidden_size=spec.hidden_size,
                         intermediate_size=spec.expert_intermediate_size,
                         num_hidden_layers=spec.num_layers, num_attention_heads=heads,
                         num_key_value_heads=kv, num_local_experts=spec.num_experts,
                         num_experts_per_tok=spec.top_k, max_position_embeddings=max_positions,
                         tie_word_embeddings=False)


def build_random(spec: ModelSpec, device: torch.device, *, seed: int = 0) -> nn.Module:
    """A Mixtral model with ``spec``'s shape and random weights (dtype from ``spec.dtype_bytes``),
    drawn on ``device``."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    dtype = DTYPE_OF.get(int(spec.dtype_bytes))
    if dtype is None:
        raise MoesimError(f"model {spec.name!r}: dtype_bytes {spec.dtype_bytes} has no torch dtype "
                          "for the executor (4 = float32, 2 = bfloat16)")
    cfg = mixtral_config(spec)
    # the weights are drawn where the model runs: a real-shaped layer stack holds billions of
    # weights, which a GPU draws in well under a second and one CPU thread in minutes
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.to(device).eval()


def load(model_ref: str | None, spec: ModelSpec | None, device: torch.device, *, seed: int = 0) -> OffloadModel:
    """The executor's model: ``model_ref`` (a local model directory or config JSON) when given,
    else a random Mixtral of ``spec``'s shape. Returns it prepared (experts in the host pool)."""
    source: dict[str, Any]
    if model_ref is not None:
        from moesim.traces.tracer.model_loading import load_model

        lm = load_model(model_ref, device=str(device), seed=seed)
        model, source = lm.model, dict(lm.source)
        name = lm.name
    else:
        if spec is None:
            raise MoesimError("the executor needs a model: --model PATH or a model spec")
        model = build_random(spec, device, seed=seed)
        source = {"model": f"random Mixtral of {spec.name}'s shape (seed {seed})"}
        name = spec.name
    return prepare(model, device, name=name, source=source)


def prepare(model: nn.Module, device: torch.device, *, name: str, source: dict[str, Any]) -> OffloadModel:
    """Take the experts out of ``model`` into a host pool and install :class:`OffloadedMoe`."""
    from moesim.sim.real.executor.kernels import expert_numel
    from moesim.traces.tracer.arch import find_moe_layers

    arch, layers, _ = find_moe_layers(model)
    if arch.model_type != "mixtral":
        raise MoesimError(f"{name}: the executor runs Mixtral-architecture models; this is {arch.name}")
    cfg: Any = model.config
    hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
    E, k = int(cfg.num_local_experts), int(cfg.num_experts_per_tok)
    dtype = next(model.parameters()).dtype
    host: list[torch.Tensor] = []
    blocks: list[OffloadedMoe] = []
    n = expert_numel(hidden, inter)
    pin = device.type == "cuda"
    for ml in layers:
        ex: Any = ml.experts
        gu, dn = ex.gate_up_proj.detach(), ex.down_proj.detach()
        flat = torch.empty((E, n), dtype=dtype, device="cpu", pin_memory=pin)
        flat[:, :2 * inter * hidden].copy_(gu.reshape(E, -1))
        flat[:, 2 * inter * hidden:].copy_(dn.reshape(E, -1))
        host.append(flat)
        block = OffloadedMoe(ml.router, ml.index, hidden)
        # a plain attribute, not a submodule: the decoder layer holds the block (no cycle)
        object.__setattr__(block, "decoder_layer", ml.decoder_layer)
        setattr(ml.decoder_layer, arch.block_attr, block)
        blocks.append(block)
    model.to(device)
    non_expert = sum(p.numel() for p in model.parameters()) * DTYPE_BYTES.get(dtype, 4)
    spec = get_model({"name": name, "num_layers": len(layers), "num_experts": E, "top_k": k,
                      "hidden_size": hidden, "expert_intermediate_size": inter,
                      "dtype_bytes": DTYPE_BYTES.get(dtype, 4), "non_expert_bytes": int(non_expert)})
    vocab = int(cfg.vocab_size)
    return OffloadModel(model=model, blocks=blocks, host_experts=host, spec=spec, device=device,
                        dtype=dtype, hidden=hidden, inter=inter, vocab_size=vocab, source=source)


def trained_weights(spec: ModelSpec | None) -> str | None:
    """The folder of real weights for ``spec`` when it is exactly the catalog entry of a model
    trained in this repository (``tiny-moe``, ``fine-moe``: :mod:`moesim.traces.tiny.tiny_model`),
    else None."""
    from moesim.traces.tiny.tiny_model import BUNDLED, model_dir

    if spec is None or spec.name not in BUNDLED or spec != get_model(spec.name):
        return None
    return str(model_dir(spec.name))


def model_argument(arg: str | None, default: ModelSpec | None) -> tuple[str | None, ModelSpec | None]:
    """``--model``: an existing path (a model directory or config JSON: loaded), a model catalog
    name or an inline YAML mapping of a model spec (a random Mixtral of that shape); None gives
    ``default``. The catalog's ``tiny-moe`` and ``fine-moe`` (by name, or as ``default``) are the
    bundled trained models, not random weights; ``tiny-moe`` is the executor's default real model. Returns
    ``(path, spec)``, one of them None."""
    from pathlib import Path

    import yaml

    if arg is None:
        real = trained_weights(default)
        return (real, None) if real is not None else (None, default)
    if Path(arg).exists():
        return arg, None
    if arg.strip() == "random":
        if default is None:
            raise MoesimError("--model random: needs a scenario whose model shape to use")
        return None, default
    if arg.lstrip().startswith("{"):
        try:
            data = yaml.safe_load(arg)
        except yaml.YAMLError:
            raise MoesimError(f"--model {arg!r}: not a YAML mapping") from None
        if not isinstance(data, dict):
            raise MoesimError(f"--model {arg!r}: not a YAML mapping")
        data.setdefault("name", "inline")
        try:
            return None, get_model(data)
        except MoesimError:
            raise
        except ValueError as exc:
            raise MoesimError(f"--model: {str(exc).splitlines()[0]}") from None
    try:
        spec = get_model(arg)
    except MoesimError as exc:
        raise MoesimError(f"--model: {exc}") from None
    real = trained_weights(spec)
    return (real, None) if real is not None else (None, spec)
