"""``vllm-offload``: vLLM's weight offloading before its UVA rewrite (``--cpu-offload-gb``, v0.4.x
to the V0 engine of v0.8), the only way vLLM v0.7.0 runs a model larger than the GPU, and so
what CommitMoE's "vLLM (v0.7.0)" baseline does (CommitMoE, sections 5.1 and 5.3; spec sheet
reading A, C5).

What the code does (``maybe_offload_to_cpu`` in ``vllm/model_executor/models/utils.py``, called
by ``make_layers`` on each decoder layer in order): the parameters of the first decoder layers,
experts and attention alike, move to **pinned** CPU memory ("use pin_memory if possible") until
``cpu_offload_gb`` is reached; the wrapped ``forward`` of such a layer then copies its whole
state dict to the GPU (``v.to(device, non_blocking=True)``) and runs it through
``functional_call``, on **every** forward pass, with nothing cached between passes. The copies
are issued on the compute stream, so nothing overlaps them. vLLM PR #15354 (March 2025, which
replaced this with UVA views for the V1 engine) describes the old path the same way: "before
every forward in every layer, we move tensors from cpu to gpu, and compute in gpu". No expert is
loaded on demand: a fused-MoE layer's tensors hold all its experts.

In moesim this is :class:`~moesim.policies.baselines.accelerate.Accelerate`'s stream (every
expert of a streamed layer copied each pass, the layer's non-expert weights first, all freed
after the layer) at the **pinned** rate (``pcie_gbps``) instead of the pageable one.
Differences, none of which changes a pass's time: vLLM offloads the *leading* layers and keeps
the trailing ones, moesim keeps the leading ones (each pass crosses every layer once, and
nothing overlaps); vLLM offloads per parameter, so one layer may be split, where moesim streams
whole layers (the budget keeps room for one streamed layer, as vLLM's ``functional_call`` needs
one layer's copies on the GPU at a time).
"""

from __future__ import annotations

from moesim.policies.baselines.accelerate import Accelerate
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register


@register
class VllmOffload(Accelerate):
    """Whole offloaded layers copied from pinned host memory before each forward pass, no cache,
    no overlap (vLLM ``--cpu-offload-gb`` before UVA; see the module docstring)."""

    name = "vllm-offload"
    host_memory = "pinned"
    summary = "stream every offloaded layer's weights from pinned memory each pass, no cache (vLLM cpu-offload-gb)"
    paper = ("vLLM --cpu-offload-gb (maybe_offload_to_cpu, v0.4-v0.8 V0; replaced by UVA in vllm-project/vllm "
             "PR #15354): the 'vLLM (v0.7.0)' baseline of CommitMoE, sections 5.1 and 5.3")
    setup_needs = SetupNeeds()
