"""``accelerate``: Hugging Face accelerate's big-model offloading (``device_map="auto"`` with
the rest on the CPU), the "naive offloading" of Eliseev & Mazur's Table 2 and the
"Accelerate" row of the MoE-Infinity README.

``device_map="auto"`` fills the GPU with whole decoder layers in order, keeping room for the
largest offloaded layer (``infer_auto_device_map``); the layers that do not fit stay on the CPU,
in pageable memory (the offload path never pins). At every forward pass, a hook copies each
offloaded layer's weights, **all** its experts and its attention, to the GPU before the layer
runs (``AlignDevicesHook.pre_forward``: ``set_module_tensor_to_device``, a blocking copy), and
frees them after it (``post_forward``): no cache, no prefetch, nothing overlapped. So in
huggingface/accelerate v0.25.0 (2023-12-01, the release of Eliseev & Mazur's month) and on its
main branch (16cb6eb8): one ``value.to(device)`` without ``non_blocking`` per tensor, from
``dispatch_model``'s ``OffloadedWeightsLoader`` over the model's CPU ``state_dict``; nothing
under ``src/`` pins memory but the DataLoader; each call ends with ``torch.cuda.empty_cache()``
(``clear_device_cache()`` since mid-2024), host work priced here only by the runtime's
``pageable_copy_us`` (0 unless set). accelerate sizes and moves only a module's parameters and
buffers: modules that keep their weights as plain attributes (hqq v0.1.1's ``HQQLinear``, which
Eliseev & Mazur's code pins) are neither placed nor streamed by it, so on their naive rows this
policy models a whole-layer loader the paper does not publish (see the set's notes).

In moesim: ``resident_layers`` (None: as many leading layers as fit beside one layer's room)
are loaded with the model; for every other layer the routed experts load on demand and the
rest are copied too (``Plan.wait_for``: the layer waits for all), at the hardware's pageable
rate (``host_memory = "pageable"``), and all leave after the layer. The layer's non-expert
weights (``model.non_expert_bytes / num_layers``) are copied first, as host time the GPU waits
for (``stream_non_expert``; reported as policy CPU time). Differences: the expert copies start
after the layer's attention computes, not before it (the same sum, nothing overlaps either
way), and a budget below one layer's experts lets the layer pass through piecewise where
accelerate would run out of memory (warned).
"""

from __future__ import annotations

from typing import Any

from moesim.policies.contract.base import (
    Context,
    EvictionRequest,
    Plan,
    Policy,
    PolicySetupError,
    ReadView,
    Routing,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.sim.config.catalog import GIB


@register
class Accelerate(Policy):
    """Whole decoder layers streamed from pageable host memory each forward pass, synchronously,
    no cache (see the module docstring)."""

    name = "accelerate"
    scope = "global"
    host_memory = "pageable"
    summary = "stream every offloaded layer's experts from pageable memory each pass, no cache (HF accelerate)"
    paper = ("Hugging Face accelerate device_map offloading (AlignDevicesHook); the naive row of Eliseev & "
             "Mazur, arXiv 2312.17238, Table 2")
    setup_needs = SetupNeeds()

    def __init__(self, *, resident_layers: int | None = None, stream_non_expert: bool = True) -> None:
        if resident_layers is not None and resident_layers < 0:
            raise ValueError("resident_layers must be >= 0")
        self.resident_layers = resident_layers
        self.stream_non_expert = stream_non_expert
        self.resident = 0
        self._E = 0
        self._non_expert_s = 0.0
        self._kept: set[UnitKey] = set()

    def read_columns(self) -> frozenset[str]:
        """No optional trace column: it streams whole layers whatever the routing predicts."""
        return frozenset()

    def setup(self, ctx: Context) -> None:
        """Decide the resident layers; refuse an explicit count the budget cannot hold."""
        L, E = ctx.num_layers, ctx.num_experts
        self._E = E
        layer_bytes = E * ctx.expert_bytes
        fit = int(ctx.total_budget // layer_bytes)
        if self.resident_layers is None:
            self.resident = L if fit >= L else max(0, fit - 1)
        else:
            self.resident = min(self.resident_layers, L)
            need = (self.resident + (1 if self.resident < L else 0)) * layer_bytes
            if need > ctx.total_budget:
                raise PolicySetupError(
                    f"{self.name}: {self.resident} resident layers and one streamed layer of {E} experts need "
                    f"{need / GIB:.2f} GiB; the expert budget is {ctx.total_budget / GIB:.2f} GiB")
        if self.resident < L and fit < 1:
            ctx.warn(f"{self.name}: the expert budget holds {ctx.total_budget // ctx.expert_bytes} experts, less "
                     f"than one decoder layer's {E}; each streamed layer passes through it piecewise "
                     f"({self.name} itself would run out of GPU memory)")
        per_layer = ctx.model.non_expert_bytes / L if self.stream_non_expert else 0.0
        self._non_expert_s = ctx.cost.transfer_s(per_layer) if per_layer > 0 else 0.0
        self._kept = {(layer, e, 0) for layer in range(self.resident) for e in range(E)}

    def preload(self, ctx: Context) -> list[UnitKey]:
        """The resident layers' experts, loaded with the model."""
        return sorted(self._kept)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """``cache.initial`` places nothing here: its units leave."""
        for key in units:
            if key not in self._kept:
                view.evict(*key)

    def before_layer(self, view: View, layer: int) -> None:
        """A streamed layer's non-expert weights are copied first; the GPU waits."""
        if layer >= self.resident and self._non_expert_s:
            view.spend_cpu(self._non_expert_s)

    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """A streamed layer copies every expert: the routed ones on demand, the others too."""
        if layer < self.resident:
            return None
        ex = routing.experts
        routed = set(ex.ravel().tolist())   # -1 (dropped) is never an expert below
        others = []   # a plain loop: a comprehension is a call of its own
        prefetch = view.prefetch
        for e in range(self._E):
            if e not in routed:
                others.append(e)
                prefetch(layer, e)
        return Plan(ex.copy(), wait_for=tuple(others))

    def on_layer_end(self, view: View, layer: int) -> None:
        """A streamed layer's weights are freed."""
        if layer >= self.resident:
            evict = view.evict
            for layer_, e, p in view.units_of_layer(layer):
                evict(layer_, e, p)

    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """A streamed layer's leftover; never a resident layer's expert."""
        for key in request.candidates:
            if key not in self._kept:
                return key
        return request.decline

    def report(self) -> dict[str, Any]:
        """How many layers stayed on the GPU."""
        return {"resident_layers": self.resident}
