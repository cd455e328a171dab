"""The decoder layers Hugging Face accelerate keeps on one GPU for Eliseev & Mazur's naive rows
(arXiv 2312.17238v1, Table 2, "Naive offloading (accelerate)"), derived from accelerate's placement
rule and each GPU's memory, not from the rows' measured speeds. The measurement sets carry the
counts it prints as ``policy.params.resident_layers``.

    python benchmarks/accelerate_placement.py

The rule (huggingface/accelerate ``src/accelerate/utils/modeling.py``, as of commit 16cb6eb8;
the 90% cap since a24189db, 2023-08-01, before the paper):

1. ``get_max_memory``: the GPU's budget is its free memory (``torch.cuda.mem_get_info``), i.e.
   the memory the driver shows less the CUDA context of the process.
2. ``get_balanced_memory`` (what ``device_map="auto"`` calls): with one GPU and no
   ``max_memory`` given, 90% of it ("10% for the buffer to avoid OOM").
3. ``infer_auto_device_map``: modules in order (the embeddings, then the decoder layers, which
   ``no_split_module_classes`` keeps whole); once anything must be offloaded, the main device
   keeps room for the largest offloaded layer; the first layer that does not fit and every one
   after it go to the CPU.

So resident = floor((0.9 x (visible - context) - embeddings - one layer) / one layer), capped at
the model's layers (everything fits: nothing is offloaded). Byte sizes are the catalog models'
(``mixtral-8x7b-hqq-a4e2`` / ``-a4e3``, from the paper's Table 1): a layer is its 8 experts and a
32nd of the non-expert weights less the fp16 embeddings and head (32000 x 4096 x 2 B each).

Memory the driver shows (MiB): the RTX 3080 Laptop 16 GB and RTX 3060 12 GB 16384 and 12288;
the T4 15360 (its 16 GB with ECC on, as Colab and Azure run it; nvidia-smi there shows
15360MiB); the A100-80GB 81920. The CUDA context is not in any source of the paper; it is
printed at 0.3, 0.5 and 0.8 GiB (a PyTorch process's context on these GPUs lies in that
range), and the sets take the 0.5 GiB count; the table shows where the count moves with it.

The A100: the rule keeps all 32 layers (the 2-bit model is 17.5 GiB of 72 GiB), so nothing would
be streamed, yet the paper's naive A100 row (1.392 tokens/s) is slower than its own offloading
rows on the same GPU (3.061): the naive A100 run had a memory cap the paper does not state. No
count is derived for it; the sets keep their older assumption there (see their notes).

What the rule stands on: it prices the quantised bytes as if accelerate could see them. With the
hqq the authors' code pins (dvmazur/mixtral-offloading requirements.txt: mobiusml/hqq@37502bea,
v0.1.1) it could not: an ``HQQLinear`` keeps ``W_q`` and ``meta`` as plain attributes, not
parameters or buffers, and its ``.to()`` does nothing, while accelerate's
``compute_module_sizes`` and ``AlignDevicesHook`` see only parameters and buffers
(``named_module_tensors``). So the naive runs' loader is not stock accelerate, and these counts
are an assumption about it, the same at both widths only if that loader placed layers by bytes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 1024**3
VOCAB, HIDDEN = 32000, 4096
"""Mixtral-8x7B's vocabulary and hidden size (config.json of mistralai/Mixtral-8x7B-v0.1)."""

VISIBLE_MIB = {"rtx-3080-laptop-16gb": 16384, "rtx-3060-12gb": 12288, "t4": 15360, "a100-sxm-80gb": 81920}
"""Memory the driver shows for each GPU of Table 2 (see the module docstring)."""

CONTEXTS_GIB = (0.3, 0.5, 0.8)
"""CUDA context sizes tried; the sets use the middle one."""

USED_CONTEXT_GIB = 0.5
"""The CUDA context the sets' counts are derived with."""

CAP = 0.9
"""accelerate's ``get_balanced_memory`` share of one GPU's free memory."""


def resident_layers(hardware: str, model: str, context_gib: float = USED_CONTEXT_GIB) -> int:
    """Decoder layers accelerate's ``device_map="auto"`` keeps on ``hardware`` for ``model``."""
    return resident_for_budget(model, CAP * (VISIBLE_MIB[hardware] / 1024 * GIB - context_gib * GIB))


def resident_for_budget(model: str, budget: float) -> int:
    """Decoder layers ``infer_auto_device_map`` keeps for ``model`` in ``budget`` bytes of GPU
    memory (step 3 of the module docstring): the whole model if it fits, else the layers that fit
    beside the embeddings and room for one offloaded layer. A ``max_memory`` the user gives is
    such a budget as it stands (``get_balanced_memory`` takes its 90% only when none is given)."""
    from moesim.sim.config.catalog import get_model

    m = get_model(model)
    embed = VOCAB * HIDDEN * 2
    layer = m.num_experts * m.expert_bytes + (m.non_expert_bytes - 2 * embed) / m.num_layers
    if embed + m.num_layers * layer <= budget:
        return int(m.num_layers)
    return max(0, math.floor((budget - embed - layer) / layer))


def main() -> None:
    """Print the resident layers of each GPU and expert width of Table 2."""
    models = ("mixtral-8x7b-hqq-a4e2", "mixtral-8x7b-hqq-a4e3")
    print("| hardware | model | " + " | ".join(f"context {c} GiB" for c in CONTEXTS_GIB) + " |")
    print("| --- " * (2 + len(CONTEXTS_GIB)) + "|")
    for hw in VISIBLE_MIB:
        for model in models:
            cells = [str(resident_layers(hw, model, c)) for c in CONTEXTS_GIB]
            print(f"| {hw} | {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
