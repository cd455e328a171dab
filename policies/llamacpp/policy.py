"""``cpu-moe``: llama.cpp's MoE offloading as a user sets it up (ggml-org/llama.cpp).

* **Placement** (:mod:`moesim.policies.llamacpp.placement`): the routed experts of the layers
  that ``--cpu-moe``, ``--n-cpu-moe N`` or ``-ot`` rules (``override_tensor``) put on the CPU
  stay in host memory; every other layer's experts are loaded onto the GPU with the model
  (``-ngl 99``) and never leave. Without any of the three (``n_cpu_moe: None``) the policy
  takes the fewest leading blocks that let the rest fit the expert budget, as a user lowering
  ``--n-cpu-moe`` until the model loads would. A placement that does not fit the budget is
  refused with one line.
* **Decode and small batches**: an expert of a CPU layer runs on the CPU (the ``MUL_MAT_ID`` on
  host weights; only activations cross the link), timed by the host model
  (:mod:`moesim.sim.config.catalog.host`).
* **Large batches** (``op_offload_min_batch``, llama.cpp's CUDA backend: 32 tokens, hard-coded;
  PR #6083, issue #18530): the scheduler copies the CPU layer's expert weights to the GPU and
  runs the layer's ``MUL_MAT_ID`` there; the copies are dropped after the layer. Which experts
  it copies, ``op_offload_copy``: ``"used"`` (the default; llama.cpp since PR #15346, "sched :
  copy only the used experts when offloading prompt processing", merged August 2025) copies the
  experts that any token of the batch routes to and no other (ggml-backend.cpp,
  ``ggml_backend_sched_compute_splits``: a bitset of the ids over all tokens and slots); here
  each is a demand load of its own, where llama.cpp copies each run of consecutive used ids in
  one call per weight tensor, so the per-copy latency is counted per expert, and each expert
  computes as its copy lands, where llama.cpp's ``MUL_MAT_ID`` starts after the last (at most
  the layer's expert compute apart). ``"all"`` (builds
  before that PR) copies every expert of the layer not already on the GPU and the layer waits
  for all of them (``Plan.wait_for``). Either way the copies need room for one layer's whole
  tensors beside the placement (llama.cpp allocates the full tensor in the compute buffer and
  fills the used parts; an inference from the mechanism): without it, op offload is off
  (warned). ``0`` turns it off (``--no-op-offload``): large batches then run on the CPU too.
* **Host memory of the copies** (``mmap``, ``no_host``): llama.cpp puts a CPU layer's experts
  in the GPU backend's host buffer type (pinned, ``cudaMallocHost``; ``make_cpu_buft_list``)
  unless the model is loaded by mmap (its default; ``--no-mmap``, llama-bench ``-mmp 0``, turns
  it off), which demotes them to the plain CPU buffer over the file's mapping ("avoid using a
  host buffer when using mmap", llama-model-loader), or ``--no-host`` leaves the host buffer
  out. So with ``mmap`` (the default) or ``no_host`` the policy's copies come from pageable
  memory (``host_memory = "pageable"``: the hardware's pageable rate), as ggml-org/llama.cpp
  issue #25859's Nsight profile of ``-ncmoe`` prefill shows (copies staged through a pageable
  bounce buffer, serial with the matmuls); ``mmap: false`` gives pinned copies at
  ``pcie_gbps``. A runtime's ``host_memory`` overrides it. Not modelled: a failed pinned
  allocation, after which llama.cpp falls back to the plain CPU buffer.
* **Hot cache** (``hot_cache_slots`` per CPU layer, ggml-org/llama.cpp PR #27861's
  ``--moe-expert-cache N``, an open pull request): a per-layer LRU of GPU copies in front of
  the CPU experts. A resident copy runs on the GPU (a hit); a missed expert runs on the CPU and
  is then uploaded in the background, at most ``hot_cache_inserts`` per layer and pass
  (``--moe-expert-cache-inserts``; None: no cap), evicting that layer's least recently used
  copy. That the miss itself runs on the CPU and the upload does not delay it is an assumption
  (the pull request's description does not say), and so is that the uploads read the CPU
  layer's tensors where they are, in the host memory above (it names no staging buffer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moesim.policies.contract.base import (
    ABSENT,
    RESIDENT,
    Context,
    EvictionRequest,
    Outcome,
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
from moesim.policies.llamacpp.placement import cpu_layers, parse_overrides
from moesim.sim.config.catalog import GIB

OP_OFFLOAD_COPIES = ("used", "all")
"""Values of ``op_offload_copy``: the experts the batch routes to (llama.cpp since PR #15346), or
the whole layer (builds before it)."""


@register
class CpuMoe(Policy):
    """llama.cpp's ``--cpu-moe`` / ``--n-cpu-moe`` / ``-ot`` placement, CPU experts, op offload
    of large batches and the optional GPU hot-cache (see the module docstring). One global
    pool holds the GPU layers, the hot caches and the op-offload room."""

    name = "cpu-moe"
    scope = "global"
    summary = "llama.cpp --n-cpu-moe: the first layers' experts run on the CPU, the rest stay on the GPU"
    paper = ("llama.cpp --cpu-moe (PR #14992), --n-cpu-moe (PR #15077), -ot overrides, op offload of "
             "batches >= 32 (PR #6083) copying only the used experts (PR #15346), pageable copies under mmap "
             "(llama-model-loader; issue #25859); GPU expert hot-cache: PR #27861 (open)")
    setup_needs = SetupNeeds()

    def __init__(self, *, n_cpu_moe: int | None = None, cpu_moe: bool = False, override_tensor: str = "",
                 dense_blocks: int = 0, hot_cache_slots: int = 0, hot_cache_inserts: int | None = None,
                 op_offload_min_batch: int = 32, op_offload_copy: str = "used", mmap: bool = True,
                 no_host: bool = False) -> None:
        for key, value in (("n_cpu_moe", n_cpu_moe), ("dense_blocks", dense_blocks),
                           ("hot_cache_slots", hot_cache_slots), ("hot_cache_inserts", hot_cache_inserts),
                           ("op_offload_min_batch", op_offload_min_batch)):
            if value is not None and value < 0:
                raise ValueError(f"{key} must be >= 0")
        if op_offload_copy not in OP_OFFLOAD_COPIES:
            raise ValueError(f"op_offload_copy must be one of {', '.join(OP_OFFLOAD_COPIES)}, got {op_offload_copy!r}")
        self._rules = parse_overrides(override_tensor)
        self.n_cpu_moe = n_cpu_moe
        self.cpu_moe = cpu_moe
        self.override_tensor = override_tensor
        self.dense_blocks = dense_blocks
        self.hot_cache_slots = hot_cache_slots
        self.hot_cache_inserts = hot_cache_inserts
        self.op_offload_min_batch = op_offload_min_batch
        self.op_offload_copy = op_offload_copy
        self.mmap = mmap
        self.no_host = no_host
        self.host_memory = "pageable" if mmap or no_host else "pinned"
        self.cpu: frozenset[int] = frozenset()
        self.op_offload = False
        self._E = 0
        self._reset()

    def _reset(self) -> None:
        self._gpu: set[UnitKey] = set()             # preloaded GPU layers' experts (never evicted)
        self._hot: dict[int, dict[UnitKey, int]] = {}   # CPU layer -> hot copy -> last use
        self._tick = 0
        self._staging: set[UnitKey] = set()         # op-offload copies, dropped after their layer
        self._busy: set[UnitKey] = set()            # experts the current layer runs (never victims)
        self._issuing_hot = False
        self.counts = {"op_offload_passes": 0, "hot_uploads": 0}

    # -- placement ------------------------------------------------------------------------------
    def _need(self, ctx: Context, n_cpu: int) -> int:
        """Bytes the placement needs: the GPU layers' experts and the CPU layers' hot caches."""
        E = ctx.num_experts
        return ((ctx.num_layers - n_cpu) * E + min(self.hot_cache_slots, E) * n_cpu) * ctx.expert_bytes

    def read_columns(self) -> frozenset[str]:
        """No optional trace column: its placement is fixed by layer and its hot cache is an LRU of what ran."""
        return frozenset()

    def setup(self, ctx: Context) -> None:
        """Place the layers; refuse a placement the budget cannot hold."""
        self._reset()
        self._E = ctx.num_experts
        L, budget = ctx.num_layers, ctx.total_budget
        if self.cpu_moe or self.n_cpu_moe is not None or self._rules:
            blocks = L + self.dense_blocks if self.cpu_moe else (self.n_cpu_moe or 0)
            try:
                self.cpu = cpu_layers(L, dense_blocks=self.dense_blocks, n_cpu_moe=blocks, overrides=self._rules)
            except ValueError as exc:
                raise PolicySetupError(f"cpu-moe: {exc}") from None
            need = self._need(ctx, len(self.cpu))
            if need > budget:
                raise PolicySetupError(
                    f"cpu-moe: {L - len(self.cpu)} GPU layers x {ctx.num_experts} experts"
                    + (f" and hot caches of {self.hot_cache_slots}" if self.hot_cache_slots and self.cpu else "")
                    + f" need {need // ctx.expert_bytes} experts ({need / GIB:.2f} GiB); the expert budget holds "
                    f"{budget // ctx.expert_bytes} ({budget / GIB:.2f} GiB): raise n_cpu_moe or the budget")
        else:   # fit: the fewest leading layers on the CPU
            fits = [n for n in range(L + 1) if self._need(ctx, n) <= budget]
            if not fits:
                raise PolicySetupError(f"cpu-moe: even with every layer on the CPU, hot caches of "
                                       f"{self.hot_cache_slots} experts per layer need "
                                       f"{self._need(ctx, L) // ctx.expert_bytes} experts; the expert budget "
                                       f"holds {budget // ctx.expert_bytes}")
            self.cpu = frozenset(range(fits[0]))
        room = budget - self._need(ctx, len(self.cpu))
        self.op_offload = self.op_offload_min_batch > 0 and bool(self.cpu)
        if self.op_offload and room < ctx.num_experts * ctx.expert_bytes:
            self.op_offload = False
            ctx.warn("cpu-moe: the expert budget has no room beside the placement for op offload's copy of one "
                     f"layer's experts ({room / GIB:.2f} GiB left), so batches of {self.op_offload_min_batch} "
                     "tokens or more run on the CPU too (as --no-op-offload)")
        self._gpu = {(layer, e, 0) for layer in range(L) if layer not in self.cpu for e in range(ctx.num_experts)}
        self._hot = {layer: {} for layer in self.cpu}

    def preload(self, ctx: Context) -> list[UnitKey]:
        """The GPU layers' experts, loaded with the model."""
        return sorted(self._gpu)

    def warm(self, view: View, units: list[UnitKey]) -> None:
        """``cache.initial`` places nothing here: its units leave."""
        for key in units:
            if key not in self._gpu:
                view.evict(*key)

    # -- per layer ------------------------------------------------------------------------------
    def on_routed(self, view: View, layer: int, routing: Routing) -> Plan | None:
        """GPU layers run as routed; a CPU layer runs its experts on the CPU (hot copies on the
        GPU), or, for a batch of op_offload_min_batch tokens or more, copies the experts the batch
        uses (``op_offload_copy="used"``) or the whole layer (``"all"``) and runs it on the GPU."""
        if layer not in self.cpu:
            return None
        ex = routing.experts
        routed = sorted({int(e) for e in ex.reshape(-1) if e >= 0})
        if self.op_offload and routing.n_tokens >= self.op_offload_min_batch:
            self.counts["op_offload_passes"] += 1
            self._busy = {(layer, e, 0) for e in routed}
            others = tuple(e for e in range(self._E) if e not in routed) if self.op_offload_copy == "all" else ()
            for e in others:
                if view.state(layer, e) == ABSENT and view.prefetch(layer, e, priority=1.0):
                    self._staging.add((layer, e, 0))
            for e in routed:
                if view.state(layer, e) == ABSENT:   # a demand load this layer: dropped after it
                    self._staging.add((layer, e, 0))
            return Plan(ex.copy(), wait_for=others)
        on_cpu = np.zeros(ex.shape, dtype=bool)
        for e in routed:
            if view.state(layer, e) != RESIDENT:
                on_cpu |= ex == e
        return Plan(ex.copy(), on_cpu=on_cpu) if on_cpu.any() else None

    def on_access(self, view: View, layer: int, outcome: Outcome) -> None:
        """Hot copies that ran count as used now."""
        hot = self._hot.get(layer)
        if hot:
            for e in outcome.experts:
                key = (layer, e, 0)
                if key in hot:
                    self._tick += 1
                    hot[key] = self._tick

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        """Upload the experts that ran on the CPU into the layer's hot cache (LRU)."""
        hot = self._hot.get(layer)
        if hot is None or not self.hot_cache_slots or not outcome.cpu_experts:
            return
        cap = len(outcome.cpu_experts) if self.hot_cache_inserts is None else self.hot_cache_inserts
        done = 0
        for e in outcome.cpu_experts:
            if done >= cap:
                break
            if view.state(layer, e) != ABSENT:
                continue
            if len(hot) >= min(self.hot_cache_slots, self._E):
                old = [k for k in sorted(hot, key=hot.__getitem__) if view.state(*k) == RESIDENT]
                if not old or not view.evict(*old[0]):
                    break
            self._issuing_hot = True
            try:
                issued = view.prefetch(layer, e)
            finally:
                self._issuing_hot = False
            if issued:
                self._tick += 1
                hot[(layer, e, 0)] = self._tick
                self.counts["hot_uploads"] += 1
                done += 1

    def on_layer_end(self, view: View, layer: int) -> None:
        """Drop the layer's op-offload copies."""
        self._busy = set()
        for key in [k for k in self._staging if k[0] == layer]:
            view.evict(*key)

    # -- room -----------------------------------------------------------------------------------
    def choose_victim(self, view: ReadView, request: EvictionRequest) -> VictimChoice:
        """Leftover op-offload copies first; for op-offload room, then the least recently used
        hot copy of any layer; never a GPU layer's expert or one the current layer runs."""
        cands = [k for k in request.candidates if k not in self._gpu and k not in self._busy]
        for k in cands:
            if k in self._staging:
                return k
        if self._issuing_hot:
            return request.decline
        hot = [(self._hot[k[0]][k], k) for k in cands if k[0] in self._hot and k in self._hot[k[0]]]
        return min(hot)[1] if hot else request.decline

    def on_evict(self, view: ReadView, unit: UnitKey) -> None:
        """Forget an evicted copy."""
        self._staging.discard(unit)
        hot = self._hot.get(unit[0])
        if hot is not None:
            hot.pop(unit, None)

    def on_cancel(self, view: ReadView, unit: UnitKey) -> None:
        """Forget a withdrawn copy."""
        self.on_evict(view, unit)

    def report(self) -> dict[str, Any]:
        """The placement and what the mechanisms did."""
        return {"cpu_layers": sorted(self.cpu), "op_offload": self.op_offload, **self.counts}
