"""The settings ``simctl advise`` tries: for each offloading system, the knobs its user sets,
with the GPU and host memory each setting takes, keeping only those that fit.

Systems and their knobs (the policy that stands for each, and its runtime overhead profile):

* ``expert cache (lru)``, ``mixtral-offloading``: the expert cache size in experts per MoE
  layer (``offload_per_layer = E - k`` in Mixtral-offloading; ``--moe-expert-cache-size`` in
  vLLM's proposal). The GPU holds ``k`` experts per layer; the host holds the others (Mixtral-
  offloading swaps an expert between its GPU and host buffers, so each expert lives in one of
  them). ``k = E`` is the whole model on the GPU. Runtime ``hf-eager``.
* ``llama.cpp``: ``--n-cpu-moe`` (the first ``n`` MoE layers' experts stay in host memory and
  run on the CPU) and the hot-cache slots per CPU layer of PR #27861 (``--moe-expert-cache``,
  an open pull request: :data:`UNMERGED_HOT_CACHE`; ``merged_only`` leaves those options out).
  The GPU holds ``(L - n) E + n h`` experts, the host ``n E``. llama.cpp's flag counts
  transformer blocks (``common/arg.cpp`` pushes one CPU override per block index ``0..N-1``,
  each the pattern ``blk.<i>.ffn_(up|down|gate|gate_up)_(ch|)exps`` of ``common/common.h``'s
  ``llm_ffn_exps_block_regex``; a dense block has no such tensor to move), so the flag printed is ``n`` plus the model's
  leading dense blocks (``ModelSpec.dense_blocks``), and the policy is given both. Runtime
  ``llama-cpp-like``. With a KV cache to place (``--context``), also ``-nkvo``
  (``--no-kv-offload``: ``llama_context_params.offload_kqv`` false): the KV cache in host memory
  and attention on the CPU (runtime ``llama-cpp-like`` with ``kv_on_host``), so the VRAM it took
  holds experts instead: :data:`HOST_KV_FLAG` and :func:`llamacpp_host_kv_options` say which.
* ``fiddler``: the GPU holds as many experts as fit, most popular first, plus one staging slot
  for a copied expert; a missed expert is computed on the CPU or copied. Its user sets nothing
  but the memory; smaller placements are listed too, for the VRAM-speed front. Runtime
  ``hf-eager``.
* ``accelerate``: ``device_map`` with ``max_memory`` deciding how many leading decoder layers
  stay resident; the rest stream from pageable host memory each pass, through room for one
  layer. The host holds the streamed layers' experts and their share of the other weights.
  Runtime ``hf-eager``.
* ``ktransformers``: ``local_chat``'s default optimize rules (every routed expert on the CPU,
  the GPU running attention and the shared experts under a CUDA graph) and, before them, a rule
  putting the experts of the last ``m`` MoE layers on the GPU (with ``--use_cuda_graph False``,
  as its docs require): :mod:`moesim.sim.study.advise_ktransformers`, which also says which
  models it runs (no options for the others) and why it runs ``ktransformers-v0.2``. The GPU
  holds ``m E`` experts; the host holds the other ``(L - m) E``, once per NUMA node on a host of
  several sockets (``Memory.numa_nodes``: built with ``USE_NUMA=1``, each node keeps its own
  copy). Policy ``cpu-moe`` (its first ``L - m`` MoE layers on the CPU); its error band is the
  published rows of system ``ktransformers`` (``Option.band_system``) predicted with its runtime.

Memory: VRAM used = the model's non-expert weights (all of them on the GPU, as the simulator
counts them) + the experts on the GPU + ``reserve_gib`` (CUDA context, KV cache, activations;
an assumption the user may change) + the KV cache of ``--context`` (``Memory.kv_gib``), which
an option with ``kv_on_host`` (llama.cpp's ``-nkvo``) counts in host memory instead. Host used
= what the system keeps there + ``host_reserve_gib`` (the operating system and the framework).
An option fits when both are within the given memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moesim.sim.config.catalog import GIB
from moesim.sim.study import advise_ktransformers as kt

RUNTIMES = {"lru": "hf-eager", "mixtral-offloading": "hf-eager", "cpu-moe": "llama-cpp-like",
            "fiddler": "hf-eager", "accelerate": "hf-eager", "ktransformers": kt.RUNTIME}
SYSTEMS = {"lru": "expert cache (lru)", "mixtral-offloading": "mixtral-offloading", "cpu-moe": "llama.cpp",
           "fiddler": "fiddler", "accelerate": "accelerate", "ktransformers": "ktransformers"}
MAX_STEPS = 8     # values tried per knob (all of them when there are few)
UNMERGED_HOT_CACHE = ("llama.cpp's --moe-expert-cache is ggml-org/llama.cpp PR #27861, an open pull request: "
                      "in no llama.cpp release; build that branch to use it")
"""What an option with llama.cpp's hot cache rests on (see ``simctl policies cpu-moe``)."""
HOST_KV_FLAG = "-nkvo"
"""llama.cpp's flag that keeps the KV cache in host memory, as llama-server and llama-cli take it
(``common/arg.cpp``: ``-nkvo, --no-kv-offload``, a switch without a value; llama-bench's own
parser takes a value, ``-nkvo 1``)."""
HOST_KV_RUNTIME: dict[str, Any] = {"kv_on_host": True}
"""What an option with :data:`HOST_KV_FLAG` changes of its runtime (``runtime.kv_on_host``)."""


@dataclass(frozen=True)
class Shape:
    """What the memory accounting needs of a model (at the weight width being tried)."""

    name: str
    num_layers: int
    num_experts: int
    expert_bytes: int
    non_expert_bytes: int
    bits: float
    dense_blocks: int = 0

    @property
    def routed_bytes(self) -> int:
        """Bytes of every routed expert."""
        return self.num_layers * self.num_experts * self.expert_bytes


@dataclass(frozen=True)
class Memory:
    """The user's memory: GPU and host, in GiB, and what is kept back on each."""

    vram_gib: float
    host_gib: float
    reserve_gib: float = 1.5
    host_reserve_gib: float = 4.0
    kv_gib: float = 0.0
    """The KV cache of the advised workload (``simctl advise --context N --batch B``); 0 without
    ``--context``, when ``reserve_gib`` stands for the KV cache too."""
    numa_nodes: int = 1
    """The host's NUMA nodes (its sockets): kTransformers built with ``USE_NUMA=1`` keeps a copy
    of its CPU experts on each."""

    @property
    def expert_room(self) -> float:
        """Bytes of VRAM left for experts once the reserve and the KV cache are kept back (before
        non-expert weights)."""
        return (self.vram_gib - self.reserve_gib - self.kv_gib) * GIB

    @property
    def host_room(self) -> float:
        """Bytes of host memory a system may fill."""
        return (self.host_gib - self.host_reserve_gib) * GIB


@dataclass
class Option:
    """One setting of one system: its policy, expert budget (whole experts on the GPU), and the
    memory it takes."""

    system: str
    policy: str
    params: dict[str, Any]
    setting: str
    gpu_experts: int
    shape: Shape
    host_bytes: float
    runtime: str
    memory: Memory
    model: dict[str, Any] = field(default_factory=dict)
    unmerged: str = ""
    """Why the option needs an upstream feature that is not merged ("" when it needs none)."""
    runtime_overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of ``runtime`` this option changes (kTransformers without its CUDA graph)."""
    published_as: str = ""
    """The ``system`` of the published rows that make its error band ("": its policy)."""
    kv_on_host: bool = False
    """The KV cache (``Memory.kv_gib``) lives in host memory, not VRAM (llama.cpp's ``-nkvo``;
    its runtime then carries ``kv_on_host`` too, :data:`HOST_KV_RUNTIME`)."""

    @property
    def band_system(self) -> str:
        """The system whose published rows give the option's error band."""
        return self.published_as or self.policy

    @property
    def runtime_ref(self) -> str | dict[str, Any]:
        """The scenario's ``runtime:``: the catalog name, or it with the option's overrides."""
        return {"base": self.runtime, **self.runtime_overrides} if self.runtime_overrides else self.runtime

    @property
    def vram_gib(self) -> float:
        """GPU memory the option takes, reserve and KV cache included (the KV cache unless it
        lives in host memory)."""
        mem = self.memory
        kv = 0.0 if self.kv_on_host else mem.kv_gib
        return (self.shape.non_expert_bytes + self.gpu_experts * self.shape.expert_bytes) / GIB + mem.reserve_gib + kv

    @property
    def host_gib(self) -> float:
        """Host memory the option takes, reserve included (and the KV cache when it lives there)."""
        return self.host_bytes / GIB + self.memory.host_reserve_gib + (self.memory.kv_gib if self.kv_on_host else 0.0)

    @property
    def experts_per_layer(self) -> float:
        """The expert budget as ``cache.experts_per_layer`` (the runner rounds ``x L`` to whole experts)."""
        return self.gpu_experts / self.shape.num_layers

    def fits(self) -> bool:
        """Both memories hold it."""
        return (self.vram_gib <= self.memory.vram_gib + 1e-9 and self.host_gib <= self.memory.host_gib + 1e-9
                and self.gpu_experts >= 1)


def steps(lo: int, hi: int, n: int = MAX_STEPS) -> list[int]:
    """Up to ``n`` integers from ``lo`` to ``hi`` (both included), spread evenly; all of them
    when there are no more than ``n``."""
    if hi < lo:
        return []
    if hi - lo + 1 <= n:
        return list(range(lo, hi + 1))
    return sorted({lo + round(i * (hi - lo) / (n - 1)) for i in range(n)})


def _max_gpu_experts(shape: Shape, mem: Memory, kv_in_vram: bool = True) -> int:
    room = mem.expert_room + (0.0 if kv_in_vram else mem.kv_gib * GIB)
    return int((room - shape.non_expert_bytes) // shape.expert_bytes)


def _least_cpu_layers(shape: Shape, room: int) -> int | None:
    """The fewest MoE layers on the CPU that let the others' experts fit ``room`` experts (every
    layer on the CPU takes one expert of room: the simulator's least budget); None when none do."""
    L, E = shape.num_layers, shape.num_experts
    return next((n for n in range(L + 1) if max(1, (L - n) * E) <= room), None)


def cache_options(shape: Shape, mem: Memory, policy: str) -> list[Option]:
    """Expert-cache sizes ``k`` per layer, 1 to ``E``."""
    L, E, eb = shape.num_layers, shape.num_experts, shape.expert_bytes
    top = min(E, _max_gpu_experts(shape, mem) // L)
    out = []
    for k in steps(1, top):
        setting = "whole model on GPU" if k == E else f"cache {k}/{E} per layer"
        if policy == "mixtral-offloading" and k < E:
            setting += f" (offload_per_layer={E - k})"
        out.append(Option(SYSTEMS[policy], policy, {}, setting, k * L, shape, (E - k) * L * eb,
                          RUNTIMES[policy], mem))
    return out


def llamacpp_flags(shape: Shape, n: int, hot: int, host_kv: bool = False) -> str:
    """The llama.cpp flags of ``n`` MoE layers on the CPU and ``hot`` cache slots per CPU layer,
    as llama.cpp spells them: ``--n-cpu-moe`` counts blocks, dense ones included; ``host_kv``:
    the KV cache in host memory (:data:`HOST_KV_FLAG`)."""
    kv = f" {HOST_KV_FLAG}" if host_kv else ""
    if n == 0:
        return f"-ngl 99{kv} (every expert on the GPU)"
    return f"-ngl 99 --n-cpu-moe {n + shape.dense_blocks}" + (f" --moe-expert-cache {hot}" if hot else "") + kv


def llamacpp_options(shape: Shape, mem: Memory, merged_only: bool = False) -> list[Option]:
    """``--n-cpu-moe`` from the fewest layers that fit up to all of them, each without and
    with a few hot-cache sizes (without them when ``merged_only``); then, with a KV cache in
    ``mem``, the settings only ``-nkvo`` lets fit (:func:`llamacpp_host_kv_options`)."""
    room = _max_gpu_experts(shape, mem)
    least = _least_cpu_layers(shape, room)
    return _llamacpp_kv_in_vram(shape, mem, room, least, merged_only) + llamacpp_host_kv_options(shape, mem, least)


def _llamacpp_kv_in_vram(shape: Shape, mem: Memory, room: int, least: int | None, merged_only: bool) -> list[Option]:
    L, E, eb = shape.num_layers, shape.num_experts, shape.expert_bytes
    out: list[Option] = []
    if least is None:
        return []
    slot_choices = [0] + ([] if merged_only else [h for h in sorted({max(1, E // 8), max(1, E // 4), max(1, E // 2)})
                                                  if h < E])
    d = shape.dense_blocks
    for n in steps(least, L):
        for h in slot_choices if n > 0 else [0]:
            gpu = max(1, (L - n) * E + n * h)   # --cpu-moe alone: the simulator's least budget, one expert
            if gpu > room:
                continue
            params: dict[str, Any] = {"n_cpu_moe": n + d if n else 0, "hot_cache_slots": h}
            if d:
                params["dense_blocks"] = d
            out.append(Option(SYSTEMS["cpu-moe"], "cpu-moe", params, llamacpp_flags(shape, n, h), gpu, shape,
                              n * E * eb, RUNTIMES["cpu-moe"], mem, unmerged=UNMERGED_HOT_CACHE if h else ""))
    return out


def llamacpp_host_kv_options(shape: Shape, mem: Memory, least_in_vram: int | None) -> list[Option]:
    """llama.cpp with ``-nkvo``: the KV cache in host memory, so its VRAM holds experts. Offered
    only where that changes what fits: ``--n-cpu-moe`` from the fewest MoE layers on the CPU
    that fit with the KV cache out of VRAM up to ``least_in_vram``, the fewest that fit with it
    in (all of them when nothing fits so: every layer on the CPU), that one included so the
    price of attention on the CPU shows beside the same experts without it; none without a KV
    cache (no ``--context``) or when moving it frees no whole layer. Without hot-cache slots (an
    unmerged feature already offered on its own) and at most :data:`MAX_STEPS` settings, so
    that ``-nkvo`` adds at most as many options as one hot-cache size does."""
    if mem.kv_gib <= 0:
        return []
    L, E, eb, d = shape.num_layers, shape.num_experts, shape.expert_bytes, shape.dense_blocks
    room = _max_gpu_experts(shape, mem, kv_in_vram=False)
    least = _least_cpu_layers(shape, room)
    if least is None or (least_in_vram is not None and least >= least_in_vram):
        return []
    out = []
    for n in steps(least, L if least_in_vram is None else least_in_vram):
        params: dict[str, Any] = {"n_cpu_moe": n + d if n else 0, "hot_cache_slots": 0}
        if d:
            params["dense_blocks"] = d
        out.append(Option(SYSTEMS["cpu-moe"], "cpu-moe", params, llamacpp_flags(shape, n, 0, host_kv=True),
                          max(1, (L - n) * E), shape, n * E * eb, RUNTIMES["cpu-moe"], mem,
                          runtime_overrides=dict(HOST_KV_RUNTIME), kv_on_host=True))
    return out


def fiddler_options(shape: Shape, mem: Memory) -> list[Option]:
    """The most popular experts that fit (the largest placement) and a few smaller ones."""
    L, E = shape.num_layers, shape.num_experts
    room = min(_max_gpu_experts(shape, mem), L * E)   # every expert placed but one, and the staging slot
    out = []
    for budget in steps(2, room):
        placed = budget - 1   # one staging slot for a copied expert
        setting = f"{placed} popular experts on GPU" + (" (all that fit)" if budget == room else "")
        out.append(Option(SYSTEMS["fiddler"], "fiddler", {"staging_experts": 1}, setting, budget, shape,
                          (L * E - placed) * shape.expert_bytes, RUNTIMES["fiddler"], mem))
    return out


def accelerate_options(shape: Shape, mem: Memory) -> list[Option]:
    """Resident decoder layers ``r`` (``max_memory`` decides it), each with room to stream one more."""
    L, E, eb = shape.num_layers, shape.num_experts, shape.expert_bytes
    room = _max_gpu_experts(shape, mem)
    out = []
    top = min(L - 1, room // E - 1)
    for r in steps(0, top):
        host = (L - r) * (E * eb + shape.non_expert_bytes / L)
        out.append(Option(SYSTEMS["accelerate"], "accelerate", {"resident_layers": r},
                          f"{r}/{L} layers resident", (r + 1) * E, shape, host,
                          RUNTIMES["accelerate"], mem))
    return out


def ktransformers_options(shape: Shape, mem: Memory) -> list[Option]:
    """Every routed expert on the CPU (the default rules), then the experts of the last ``m`` MoE
    layers on the GPU, from one layer to every layer that fits; none for a model kTransformers
    does not run."""
    rules = kt.rules_file(shape.name)
    if rules is None:
        return []
    L, E, eb, d = shape.num_layers, shape.num_experts, shape.expert_bytes, shape.dense_blocks
    room = _max_gpu_experts(shape, mem)
    out = []
    for m in [0, *steps(1, min(L, room // E))]:
        params: dict[str, Any] = {"cpu_moe": True} if m == 0 else {"n_cpu_moe": L - m + d}
        params.update(dense_blocks=d, op_offload_min_batch=0)
        if m == 0:
            setting = f"default rules ({rules}: every routed expert on the CPU)"
        else:
            setting = kt.gpu_layers_setting(rules, L - m + d, L - 1 + d)
        gpu = max(1, m * E)   # every expert on the CPU: the simulator's least budget, one expert
        out.append(Option(SYSTEMS["ktransformers"], "cpu-moe", params, setting, gpu, shape,
                          (L - m) * E * eb * mem.numa_nodes, RUNTIMES["ktransformers"], mem,
                          runtime_overrides={} if m == 0 else dict(kt.EAGER_RUNTIME),
                          published_as="ktransformers"))
    return out


def all_options(shape: Shape, mem: Memory, systems: list[str] | None = None, merged_only: bool = False) -> list[Option]:
    """Every option of the chosen systems (default: all) that fits the memory (without those
    that need an unmerged upstream feature when ``merged_only``)."""
    chosen = systems or list(SYSTEMS)
    out: list[Option] = []
    for policy in chosen:
        if policy in ("lru", "mixtral-offloading"):
            out += cache_options(shape, mem, policy)
        elif policy == "cpu-moe":
            out += llamacpp_options(shape, mem, merged_only)
        elif policy == "fiddler":
            out += fiddler_options(shape, mem)
        elif policy == "accelerate":
            out += accelerate_options(shape, mem)
        elif policy == "ktransformers":
            out += ktransformers_options(shape, mem)
    return [o for o in out if o.fits()]


def least_needed(shape: Shape, mem: Memory, host_kv: bool = False) -> str:
    """Why nothing fits, in a few words: the smallest VRAM and host memory any system needs.
    ``host_kv``: a system that may keep the KV cache in host memory is among them (llama.cpp's
    ``-nkvo``), so the least VRAM leaves the KV cache out. The least host memory is the same
    either way (within an expert): moving the KV cache to the host frees as much VRAM for
    experts, which then leave the host."""
    kv_vram = 0.0 if host_kv else mem.kv_gib
    vram = (shape.non_expert_bytes + 2 * shape.expert_bytes) / GIB + mem.reserve_gib + kv_vram
    # the least host memory: everything but what the GPU can hold
    gpu = max(0, min(shape.routed_bytes, _max_gpu_experts(shape, mem) * shape.expert_bytes))
    host = (shape.routed_bytes - gpu) / GIB + mem.host_reserve_gib
    if not mem.kv_gib:
        kv_words = ""
    elif host_kv:
        kv_words = f"; the {mem.kv_gib:.2f} GiB KV cache in host memory, llama.cpp's {HOST_KV_FLAG}"
    else:
        kv_words = f" + {mem.kv_gib:.2f} GiB KV cache"
    return (f"{shape.name} at {shape.bits:g} bits needs at least {vram:.1f} GiB of VRAM (non-expert weights "
            f"{shape.non_expert_bytes / GIB:.1f} GiB + 2 experts + {mem.reserve_gib:g} GiB reserve{kv_words}) and "
            f"{host:.1f} GiB of host memory ({shape.routed_bytes / GIB:.1f} GiB of experts, less the "
            f"{gpu / GIB:.1f} GiB the GPU can hold, + {mem.host_reserve_gib:g} GiB reserve)")
