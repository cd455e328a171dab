"""Tiny random MoE models of every architecture the torch tracer supports, for its tests
(``tests/test_tracer.py``, ``tests/test_tracer_cli.py``): configs, the reference routing rule of
each, and a cached float32 build (CPU, seeded)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=8, first_k_dense_replace=1, moe_intermediate_size=32, n_shared_experts=1)
# model_type -> (config overrides, reference routing rule, shared experts)
ARCHS: dict[str, tuple[dict[str, Any], str, int]] = {
    "mixtral": (dict(num_local_experts=8, num_experts_per_tok=2), "softmax", 0),
    "qwen2_moe": (dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, mlp_only_layers=[1]), "softmax", 1),
    "qwen3_moe": (dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8,
                       norm_topk_prob=True), "softmax", 0),
    "olmoe": (dict(num_experts=8, num_experts_per_tok=2), "softmax", 0),
    "phimoe": (dict(num_local_experts=4, num_experts_per_tok=2), "logits", 0),
    "deepseek_v2": (dict(MLA, n_routed_experts=8, num_experts_per_tok=2, q_lora_rank=None,
                         topk_method="group_limited_greedy", n_group=4, topk_group=2), "v2_grouped", 1),
    "deepseek_v3": (dict(MLA, n_routed_experts=8, num_experts_per_tok=3, q_lora_rank=16,
                         n_group=4, topk_group=2), "v3_grouped", 1),
    "glm4_moe": (dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8,
                      n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1), "v3_grouped", 1),
    "gpt_oss": (dict(num_local_experts=8, num_experts_per_tok=2, head_dim=8, sliding_window=16), "logits", 0),
}
PROMPT = (5, 17, 99, 3, 64, 8, 21, 42, 7)
NEW = 5


def torch_or_skip() -> Any:
    """torch, after transformers; the test skips without either (the ``tracer`` extra)."""
    pytest.importorskip("transformers")
    return pytest.importorskip("torch")


@cache
def build_model(model_type: str, dtype: str = "float32") -> Any:
    """The tiny random model of ``model_type`` (``ARCHS``), in ``dtype`` (float32 weights cast)."""
    torch = torch_or_skip()
    if dtype != "float32":  # the float32 model's weights, cast
        import copy

        return copy.deepcopy(build_model(model_type)).to(getattr(torch, dtype))
    import transformers

    transformers.utils.logging.set_verbosity_error()
    overrides, _, _ = ARCHS[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **{**COMMON, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        for mod in model.modules():  # a non-zero correction bias, so that the rule matters
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(torch.randn_like(mod.e_score_correction_bias) * 0.05)
    return model
