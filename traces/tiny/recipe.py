"""The recipes of the MoE models trained in this repository: shape and training settings, one
named preset per bundled model (no torch needed).

:class:`TinyConfig` is one recipe; :data:`PRESETS` names the two bundled models:

- ``tiny-moe``: 4 MoE layers x 16 experts, top-2, expert FFN 128 (a small Mixtral).
- ``fine-moe``: 8 MoE layers x 64 experts, top-8, expert FFN 32: fine-grained experts, the shape
  of OLMoE-1B-7B's routing (64 experts, 8 per token, no shared expert; catalog
  ``olmoe-1b-7b``) and of DeepSeekMoE's fine-grained expert segmentation (each of tiny-moe's
  experts cut into 4 of a quarter the width, 4 times as many chosen per token: the same active
  expert FFN per token, 8 x 32 = 2 x 128).

Both use the Hugging Face Mixtral architecture (``MixtralForCausalLM``), because it is the one
architecture that both the tracer and the executor run (:mod:`moesim.sim.real.executor.model`
refuses others). Mixtral has no shared expert; OLMoE has none either, so the fine-grained
model follows OLMoE there. Mixtral renormalises the top-k weights where OLMoE does not; that
changes how experts are mixed, never which experts run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moesim.sim.core.errors import MoesimError


@dataclass(frozen=True)
class TinyConfig:
    """Shape and training recipe of a small MoE trained here (defaults: the bundled tiny-moe).

    Shape: ``num_layers`` MoE decoder layers of ``num_experts`` experts, ``top_k`` routed per
    token, width ``hidden_size``, expert FFN width ``intermediate_size``, ``num_heads``
    attention heads sharing ``num_kv_heads`` KV heads (grouped-query attention as Mixtral's
    32/8). Training: ``steps`` AdamW steps of ``batch_size`` windows of ``seq_len`` bytes,
    peak rate ``lr`` after ``warmup`` steps, ``weight_decay``, load-balancing coefficient
    ``router_aux_loss_coef`` (0.01: Switch Transformer's alpha = 1e-2, section 2.2; Mixtral's
    HF default 0.001 is for a 8-expert model trained far longer, assumption), ``seed``,
    ``threads`` torch CPU threads. Evaluation: ``eval_windows`` evenly spaced held-out windows
    of ``seq_len``.

    Where the tiny model's numbers come from: the shape is the range asked for (4-8 MoE layers,
    16-32 experts, top-2, hidden 128-256) at its small end, with Mixtral's 4:1 query/KV head
    ratio halved (4/2); steps, batch, rate and warm-up were chosen here to train in minutes on
    two CPU cores (assumption, not from a paper); AdamW betas (0.9, 0.95) and clipping at 1 are
    the usual language-model settings (assumption).
    """

    num_layers: int = 4
    num_experts: int = 16
    top_k: int = 2
    hidden_size: int = 128
    intermediate_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 1200
    lr: float = 3e-3
    warmup: int = 80
    weight_decay: float = 0.1
    router_aux_loss_coef: float = 0.01
    seed: int = 0
    eval_windows: int = 64
    threads: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_experts", "top_k", "hidden_size", "intermediate_size",
                     "num_heads", "num_kv_heads", "seq_len", "batch_size", "steps", "eval_windows",
                     "threads"):
            if int(getattr(self, name)) < 1:
                raise MoesimError(f"tiny model: {name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise MoesimError(f"tiny model: top_k {self.top_k} > num_experts {self.num_experts}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise MoesimError(f"tiny model: hidden_size {self.hidden_size} must divide into "
                              f"num_heads {self.num_heads}, which must divide into num_kv_heads "
                              f"{self.num_kv_heads} groups")
        if self.warmup < 0 or self.lr <= 0:
            raise MoesimError("tiny model: warmup must be >= 0 and lr > 0")

    def parameters(self, vocab_size: int = 257) -> tuple[int, int]:
        """``(all parameters, routed-expert parameters)`` of this shape (untied LM head)."""
        h, i = self.hidden_size, self.intermediate_size
        head_dim = h // self.num_heads
        attn = h * h * 2 + 2 * h * head_dim * self.num_kv_heads  # q, o, k, v
        experts = self.num_experts * 3 * h * i
        per_layer = attn + experts + self.num_experts * h + 2 * h  # + router, two RMSNorms
        return 2 * vocab_size * h + h + self.num_layers * per_layer, self.num_layers * experts


FINE_MOE = TinyConfig(num_layers=8, num_experts=64, top_k=8, intermediate_size=32,
                      steps=4000, warmup=100)
"""The fine-grained recipe (``fine-moe``): see the module docstring for the shape. 8 layers
is the least asked for; hidden 128, heads, batch, window, rate and load-balancing coefficient
are tiny-moe's. 4,000 steps with 100 warm-up steps: a step took 0.60 s (median of 15) on two
cores of a Xeon with 2 torch threads, so the recipe runs in about 40 minutes on two cores,
within the hour asked for (``traces/samples/fine-moe/NOTICE.md``). Float16 weights: 13.8 MB."""

PRESETS: dict[str, TinyConfig] = {"tiny-moe": TinyConfig(), "fine-moe": FINE_MOE}
"""The recipes of the bundled models, by catalog name (``simctl model train --preset``)."""


def preset(name: str, **overrides: object) -> TinyConfig:
    """The recipe ``name`` of :data:`PRESETS`, with ``overrides`` (field: value; None = keep).

    Raises :class:`MoesimError` naming the preset or the field when either is unknown."""
    if name not in PRESETS:
        raise MoesimError(f"--preset {name!r}: unknown (known: {', '.join(PRESETS)})")
    base = PRESETS[name]
    fields = set(TinyConfig.__dataclass_fields__)
    bad = sorted(k for k in overrides if k not in fields)
    if bad:
        raise MoesimError(f"preset {name}: unknown setting {bad[0]!r}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given)  # type: ignore[arg-type]
