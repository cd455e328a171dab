"""Which MoE layers llama.cpp keeps on the CPU: ``--cpu-moe``, ``--n-cpu-moe N`` and
``--override-tensor`` (``-ot``) rules, matched as llama.cpp matches them.

llama.cpp names the routed-expert weights of transformer block ``i`` ``blk.<i>.ffn_gate_exps.weight``,
``blk.<i>.ffn_up_exps.weight`` and ``blk.<i>.ffn_down_exps.weight`` (one tensor per projection
holding every expert of the layer; shared experts are ``_shexp`` and stay on the GPU). An
override is ``PATTERN=BUFFER`` (a comma-separated list); for each tensor the rules are tried in
order and the first whose pattern is found anywhere in the name (``std::regex_search``:
unanchored) decides its buffer; ``CPU`` keeps it in host memory. ``--n-cpu-moe N`` appends one
rule ``blk\\.<i>\\.ffn_(up|down|gate)_exps`` per block ``i < N`` after the user's own
(ggml-org/llama.cpp PR #15077: "your overrides will take priority"); ``--cpu-moe`` is the same
for every block (PR #14992). ``N`` counts transformer blocks, not MoE layers: on a model whose
first blocks are dense (DeepSeek-V2-Lite: one), block ``i`` holds MoE layer
``i - dense_blocks``, so ``N`` blocks hold ``N - dense_blocks`` MoE layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROJECTIONS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class Rule:
    """One override: tensors whose name contains a match of ``pattern`` go to ``buffer``."""

    pattern: re.Pattern[str]
    buffer: str

    @property
    def to_cpu(self) -> bool:
        """The rule keeps matching tensors in host memory."""
        return self.buffer == "CPU"


def parse_overrides(text: str) -> list[Rule]:
    """``-ot`` syntax: ``PATTERN=BUFFER[,PATTERN=BUFFER...]``. A malformed rule or pattern is
    one line naming it."""
    rules = []
    for item in (x for x in text.split(",") if x.strip()):
        pattern, sep, buffer = item.strip().rpartition("=")
        if not sep or not pattern or not buffer:
            raise ValueError(f"override_tensor: {item.strip()!r} is not PATTERN=BUFFER (e.g. 'exps=CPU')")
        try:
            rules.append(Rule(re.compile(pattern), buffer.strip()))
        except re.error as exc:
            raise ValueError(f"override_tensor: bad pattern {pattern!r}: {exc}") from None
    return rules


def block_rule(block: int) -> Rule:
    """The rule ``--n-cpu-moe`` adds for one block (llama.cpp's ``llm_ffn_exps_block_regex``)."""
    return Rule(re.compile(rf"blk\.{block}\.ffn_(up|down|gate)_exps"), "CPU")


def tensor_names(block: int) -> list[str]:
    """The routed-expert weight tensors of transformer block ``block``."""
    return [f"blk.{block}.{p}.weight" for p in PROJECTIONS]


def buffer_of(name: str, rules: list[Rule]) -> str | None:
    """The buffer of the first rule matching ``name`` (None: no rule, the default placement)."""
    for rule in rules:
        if rule.pattern.search(name):
            return rule.buffer
    return None


def cpu_layers(num_layers: int, *, dense_blocks: int = 0, n_cpu_moe: int = 0,
               overrides: list[Rule] | None = None) -> frozenset[int]:
    """The MoE layers whose experts stay in host memory: the user's ``overrides`` first, then
    one rule per block ``i < n_cpu_moe``; without a matching rule a tensor goes to the GPU
    (``-ngl 99``). A layer whose three projections would not all go to the same side is
    refused (moesim places whole experts)."""
    rules = list(overrides or []) + [block_rule(i) for i in range(n_cpu_moe)]
    out = set()
    for layer in range(num_layers):
        block = layer + dense_blocks
        sides = {buffer_of(n, rules) == "CPU" for n in tensor_names(block)}
        if len(sides) > 1:
            raise ValueError(f"the overrides put some expert projections of block {block} on the CPU "
                             "and others on the GPU; moesim places whole experts")
        if sides == {True}:
            out.add(layer)
    return frozenset(out)
