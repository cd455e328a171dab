"""kTransformers as a ``simctl advise`` system: which models it runs, the optimize rule its user
writes to put whole MoE layers' experts on the GPU, the runtime it is priced with, and the
caveats a buyer needs (read at kvcache-ai/ktransformers commit 95009ea6, where the V0.2/V0.3
``local_chat`` tree lives under ``archive/ktransformers/``).

What its user sets (``archive/ktransformers/local_chat.py``): ``--cpu_infer`` (the CPU threads,
"cores + 1" in doc/en/DeepseekR1_V3_tutorial.md: 33 on 32 cores, 65 on 2 x 32) and an optimize
rule file, by default the architecture's (``default_optimize_rules``), whose experts rule puts
every routed expert of every layer on the CPU (``generate_device: "cpu"``, ``KExpertsCPU``). To
use more VRAM, doc/en/multi-gpu-tutorial.md ('How to fully utilize multi-GPU's VRAM') adds a
rule before it matching a layer range, ``generate_device: "cuda"`` with ``KExpertsMarlin``,
and says: 'You have to close the cuda graph if you want to move the experts to the GPU'
(``--use_cuda_graph False``), and 'The first matched rule in yaml will be applied'.

The runtime is ``ktransformers-v0.2`` (runtime.yaml), not ``ktransformers-sosp25``: the rule
files and ``local_chat`` flags printed are that release line's (the tutorial's V0.2/V0.3
showcases), its per-layer time was fitted on the tutorial's rows and judged on held-out ones,
while ``sosp25`` is the paper's artifact branch (``sosp25-ae``), not a release, and unfitted.
The current tree's kt-kernel under SGLang is not modelled.
"""

from __future__ import annotations

import re
from typing import Any

RUNTIME = "ktransformers-v0.2"
"""The catalog runtime kTransformers' options run (see the module's docstring for why)."""

EAGER_RUNTIME: dict[str, Any] = {"cuda_graphs": False, "layer_kernels": 97, "launch_us": 9.02}
"""What the options with experts on the GPU change of :data:`RUNTIME`: they must run with
``--use_cuda_graph False``, so every decode layer pays its launches, 97 kernels a MoE layer (DeepSeek-V3's eager count
at 64 rows or fewer, measurements/ktransformers-v021-deepseek-v3-context.yaml, applied to every
family: no count for the others) at 9.02 us each (PyTorch eager, as hf-eager)."""

FAMILIES: list[tuple[str, str, str]] = [
    (r"deepseek-(v3|r1)", "DeepseekV3ForCausalLM", "DeepSeek-V3-Chat.yaml"),
    (r"deepseek-v2(\.5)?", "DeepseekV2ForCausalLM", "DeepSeek-V2-Chat.yaml"),
    (r"qwen2-57b-a14b", "Qwen2MoeForCausalLM", "Qwen2-57B-A14B-Instruct.yaml"),
    (r"mixtral-8x(7|22)b", "MixtralForCausalLM", "Mixtral.yaml"),
]
"""Model-name patterns (the whole name, or followed by ``-``: ``deepseek-v3-q4km``), their
architecture and ``local_chat``'s default rule file: the models of doc/en/install.md's 'Supported
models' (DeepSeek-R1, V3, V2, V2.5, V2-Lite, Qwen2-57B, Mixtral-8x7B and 8x22B), which are the
architectures of local_chat.py's ``default_optimize_rules`` (its Llama entry is InternLM2.5-1M,
deprecated there, and dense)."""

SUPPORTED_WORDS = ("local_chat runs DeepSeek-R1/V3/V2/V2.5/V2-Lite, Qwen2-57B-A14B and Mixtral-8x7B/8x22B "
                   "(kvcache-ai/ktransformers doc/en/install.md 'Supported models', local_chat.py's default rules)")


def rules_file(model_name: str) -> str | None:
    """``local_chat``'s default rule file for a model of a supported family, else None."""
    for pattern, _, rules in FAMILIES:
        if re.fullmatch(rf"{pattern}(-.*)?", model_name):
            return rules
    return None


def unsupported_note(model_name: str) -> str:
    """Why kTransformers has no options for ``model_name``, in one line."""
    if model_name.startswith("qwen3-"):
        return (f"kTransformers: no options for {model_name}: it runs Qwen3-MoE only under its balance_serve server "
                "(v0.3, doc/en/AMX.md), whose costs moesim does not model; " + SUPPORTED_WORDS)
    return f"kTransformers: no options for {model_name}: {SUPPORTED_WORDS}"


def layer_regex(first: int, last: int) -> str:
    """A regex matching the integers ``first..last`` (both included), grouped by tens as the
    rule files write them: ``55..60`` -> ``5[5-9]|60``."""
    parts = []
    n = first
    while n <= last:
        tens, end = n // 10, min(last, n // 10 * 10 + 9)
        head = str(tens) if tens else ""
        lo, hi = n % 10, end % 10
        parts.append(head + (str(lo) if lo == hi else f"[{lo}-{hi}]"))
        n = end + 1
    return "|".join(parts)


def gpu_layers_setting(rules: str, first: int, last: int) -> str:
    """The setting of MoE blocks ``first..last`` (model.layers indices, dense blocks counted)
    with their experts on the GPU: the rule to put before ``rules``' experts rule, and the flag."""
    name = rf"^model\\.layers\\.({layer_regex(first, last)})\\.mlp\\.experts$"
    return (f'--use_cuda_graph False; first in {rules}: match name "{name}", generate_device "cuda", '
            'generate_op "KExpertsMarlin"')


def band_sets(cls: str, runtime: str | None = RUNTIME) -> tuple[list[str], bool]:
    """The measurement sets whose published kTransformers rows make its catalog band on a GPU of
    class ``cls`` for options running ``runtime`` (the rows
    :func:`moesim.sim.study.advise_bands.catalog_band` picks; none when it has no band), and
    whether those rows ran ``runtime``."""
    from moesim.sim.study.advise_bands import band_rows

    rows, _, ran = band_rows("ktransformers", cls, runtime=runtime)
    return list(dict.fromkeys(r["set"] for r in rows if r["prediction"] == "catalog")), ran


def shortfall_note(options: list[Any]) -> str | None:
    """Why a model kTransformers runs got no kTransformers option, in one line: what its default
    rules (every routed expert on the CPU, one copy per NUMA node) need at the narrowest width
    tried, against what was given; None when it has options or no option was tried."""
    if not options or any(o.system == "ktransformers" for o in options):
        return None
    shape, mem = min(((o.shape, o.memory) for o in options), key=lambda sm: sm[0].bits)
    gib = 2**30
    vram = (shape.non_expert_bytes + shape.expert_bytes) / gib + mem.reserve_gib + mem.kv_gib
    host = shape.routed_bytes * mem.numa_nodes / gib + mem.host_reserve_gib
    copies = f", {mem.numa_nodes} copies of the experts: one per NUMA node, USE_NUMA=1" if mem.numa_nodes > 1 else ""
    return (f"kTransformers: no option fits: at {shape.bits:g} bits its default rules need {vram:.1f} GiB of VRAM and "
            f"{host:.1f} GiB of host memory (reserves included{copies}); given {mem.vram_gib:g} and {mem.host_gib:g}")


def caveats(cpu: Any, options: list[Any], cls: str) -> list[str]:
    """kTransformers' caveats for the options of ``options`` that are its, one line each: the
    threads, NUMA copies and kernel rates assumed (its kernels want AMX/AVX-512), the 4-bit GPU
    experts (when an option has some), and which published rows its band on a GPU of class
    ``cls`` comes from."""
    mine = [o for o in options if o.system == "ktransformers"]
    if not mine:
        return []
    out = []
    numa = (f"; on {cpu.sockets} sockets built with USE_NUMA=1, as its tutorial's dual-socket run, so each NUMA node "
            f"holds its own copy of the CPU experts (the host GiB count {cpu.sockets} copies; the tutorial: 382G DRAM "
            "on one socket, 1T on two)") if cpu.sockets > 1 else ""
    host = "the assumed host" if cpu.name == "default" else f"host {cpu.name}"
    out.append(f"kTransformers is priced as its V0.2 local_chat (runtime {RUNTIME}) with all {cpu.cores} cores of "
               f"{host} on the CPU experts at the host entry's rates (it names no instruction set): give "
               f"--cpu_infer {cpu.cores + 1} (cores + 1, as doc/en/DeepseekR1_V3_tutorial.md){numa}; its runtime was fitted "
               "on that tutorial's rows, on Xeons with AMX, which it credits for 'significantly better performance compared to "
               "AVX-only alternatives': on a CPU without AMX or AVX-512 expect less")
    if any(o.gpu_experts > 1 and o.runtime_overrides for o in mine) and mine[0].shape.bits > 4.25:
        out.append("kTransformers' GPU expert layers (KExpertsMarlin) are requantised to 4-bit Marlin on load "
                   "(archive/ktransformers/operators/linear.py: num_bits 4, group_size 64): they take about "
                   f"4.25/{mine[0].shape.bits:g} of the VRAM counted here (more layers may fit) and run at 4 bits, "
                   "a quality change")
    sets, ran = band_sets(cls)
    if sets:
        other = "" if ran else f", none of them predicted with its runtime {RUNTIME}"
        out.append(f"kTransformers' error band comes from the published rows of {', '.join(sets)} (measurements/){other}")
    return out


__all__ = ["EAGER_RUNTIME", "FAMILIES", "band_sets", "RUNTIME", "SUPPORTED_WORDS", "caveats", "gpu_layers_setting", "layer_regex",
           "rules_file", "shortfall_note", "unsupported_note"]
