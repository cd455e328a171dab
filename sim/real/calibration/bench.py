"""The calibration micro-benchmarks. Each returns raw rows (plain data for the profile).

* :func:`copy_bench`: host-to-device and device-to-host copies against size, through the
  executor's own copy engines (:mod:`moesim.sim.real.executor.copier`): on a GPU from pinned
  memory on the copy stream and from pageable memory synchronously on the compute stream (how
  the executor, and accelerate's ``tensor.to(device)``, copy pageable sources); on CPU a memory
  copy between tensors on the copy thread. Sources cycle over buffers larger than the last-level
  cache so each copy reads cold memory, as an expert copy does.
* :func:`expert_bench`: the executor's expert kernel (:func:`~moesim.sim.real.executor.kernels.swiglu`)
  against tokens, cycling over enough experts that weights come from memory (``pin``: pinned
  host memory, where the executor's host pool lives on a GPU machine).
* :func:`roofline_bench`: dense matmul throughput and device memory bandwidth (the roofline
  figures a profile must carry).
* :func:`model_bench`: on the prepared model, the non-MoE part of each decoder layer (attention,
  norms, router; MoE output stubbed) against tokens and context, the LM head, and the whole
  forward pass with every expert resident run by the executor itself, whose excess over the
  summed parts is the framework overhead per layer.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from moesim.sim.real.calibration.timing import measure, sync

COLD_BYTES = 96 * 2**20   # > a server CPU's last-level cache (32 MiB here); sources cycle over this much


def _cycle(n_bytes: int, numel: int, dtype: torch.dtype, device: Any, pin: bool = False) -> list[torch.Tensor]:
    count = max(2, min(64, COLD_BYTES // max(1, n_bytes)))
    return [torch.empty(numel, dtype=dtype, device=device, pin_memory=pin).normal_() if not pin
            else torch.empty(numel, dtype=dtype, pin_memory=True).fill_(1.0) for _ in range(count)]


def _copy_closures(copier: Any, srcs: list[torch.Tensor], dsts: list[torch.Tensor]) -> tuple[Any, Any]:
    """``(h2d, d2h)``: each call copies the next buffer pair (H2D through the copy engine)."""
    from moesim.sim.real.executor.copier import DEMAND

    i = [0]

    def h2d() -> None:
        k = i[0] = i[0] + 1
        copier.wait([copier.submit(None, srcs[k % len(srcs)], dsts[k % len(dsts)], DEMAND)])

    def d2h() -> None:
        k = i[0] = i[0] + 1
        srcs[k % len(srcs)].copy_(dsts[k % len(dsts)])
    return h2d, d2h


def copy_bench(device: torch.device, sizes: list[int], *, repeat: int = 7) -> list[dict[str, Any]]:
    """Seconds per copy of each size, H2D and D2H (pinned and pageable on a GPU)."""
    from moesim.sim.real.executor.copier import make_copier

    rows = []
    modes = [("pinned", True), ("pageable", False)] if device.type == "cuda" else [("memcpy", False)]
    # pageable sources are copied synchronously on the compute stream, as the executor copies them
    copiers = {label: make_copier(device, "sync" if label == "pageable" else "auto", "priority") for label, _ in modes}
    try:
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            for label, pin in modes:
                srcs = _cycle(nbytes, numel, torch.float32, "cpu", pin)
                dsts = _cycle(nbytes, numel, torch.float32, device)
                h2d, d2h = _copy_closures(copiers[label], srcs, dsts)
                rows.append({"bytes": numel * 4, "host_memory": label,
                             "h2d_s": measure(h2d, device, repeat=repeat),
                             "d2h_s": measure(d2h, device, repeat=repeat)})
    finally:
        for copier in copiers.values():
            copier.close()
    return rows


def _expert_closure(x: torch.Tensor, experts: list[torch.Tensor], hidden: int, inter: int) -> Any:
    """A call applying the next expert of ``experts`` to ``x`` as the executor does."""
    from moesim.sim.real.executor.kernels import apply_expert

    n = x.shape[0]
    out = torch.zeros_like(x)
    w = torch.rand(n, 2, device=x.device)
    tok = torch.arange(n, device=x.device)
    slot = torch.zeros(n, dtype=torch.long, device=x.device)
    i = [0]

    def run() -> None:
        i[0] += 1
        with torch.inference_mode():
            apply_expert(out, x, w, tok, slot, experts[i[0] % len(experts)], hidden, inter)
    return run


def expert_bench(device: torch.device, hidden: int, inter: int, dtype: torch.dtype, tokens: list[int],
                 *, repeat: int = 7, pin: bool = False) -> list[dict[str, Any]]:
    """Seconds of one expert applied to ``n`` tokens as the executor applies it (gather, SwiGLU,
    weighting, scatter-add), weights cycling over cold experts (``pin``: in pinned host memory)."""
    from moesim.sim.real.executor.kernels import expert_numel

    numel = expert_numel(hidden, inter)
    esize = torch.empty(0, dtype=dtype).element_size()
    experts = [torch.randn(numel, dtype=torch.float32, device=device).mul_(0.02).to(dtype)
               for _ in range(max(2, min(32, COLD_BYTES // (numel * esize))))]
    if pin:
        experts = [t.pin_memory() for t in experts]
    rows = []
    for n in tokens:
        run = _expert_closure(torch.randn(n, hidden, device=device).to(dtype), experts, hidden, inter)
        rows.append({"tokens": n, "dtype": str(dtype).replace("torch.", ""), "s": measure(run, device, repeat=repeat)})
    return rows


def roofline_bench(device: torch.device, dtype: torch.dtype, *, size: int = 1024, mem_bytes: int = 64 * 2**20) -> dict[str, float]:
    """Dense matmul TFLOP/s (``size``^3) and memory GB/s (a ``mem_bytes`` device copy, read +
    write counted)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    t_mm = measure(lambda: torch.mm(a, b), device, repeat=5)
    src = torch.empty(mem_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t_cp = measure(lambda: dst.copy_(src), device, repeat=5)
    return {"matmul_size": size, "matmul_s": t_mm, "tflops": 2 * size**3 / t_mm / 1e12,
            "mem_bytes": mem_bytes, "mem_copy_s": t_cp, "mem_gbps": 2 * mem_bytes / t_cp / 1e9}


class _LayerTimer:
    """Times each decoder layer (pre- and post-forward hooks) with a stubbed MoE block."""

    def __init__(self, om: Any) -> None:
        self.om = om
        self.starts: dict[int, float] = {}
        self.times: dict[int, list[float]] = {}
        self.hooks: list[Any] = []
        for b in om.blocks:
            dec = b.decoder_layer
            self.hooks.append(dec.register_forward_pre_hook(lambda m, a, _i=b.index: self._start(_i)))
            self.hooks.append(dec.register_forward_hook(lambda m, a, o, _i=b.index: self._stop(_i)))

    def _start(self, i: int) -> None:
        sync(self.om.device)
        self.starts[i] = time.perf_counter()

    def _stop(self, i: int) -> None:
        sync(self.om.device)
        self.times.setdefault(i, []).append(time.perf_counter() - self.starts[i])

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


class _StubDriver:
    """The MoE block's experts stubbed out: the router still runs, the output is zeros."""

    def moe(self, layer: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    def before_layer(self, layer: int) -> None:
        pass


def _forward(om: Any, n: int, context: int) -> Any:
    """A closure running one forward of ``n`` new tokens after ``context`` cached tokens (the
    context is computed once; the cache is cropped back to it after each run)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if context:
        ids_ctx = torch.arange(context, device=om.device).view(1, -1) % om.vocab_size
        with torch.inference_mode():
            om.model(input_ids=ids_ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
    ids = (torch.arange(n, device=om.device).view(1, -1) + 7) % om.vocab_size

    def run() -> None:
        with torch.inference_mode():
            om.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-n)
    return run


def layer_bench(om: Any, tokens: list[int], contexts: list[int], *, repeat: int = 5) -> dict[str, Any]:
    """Non-MoE time per decoder layer (median over layers and runs) against tokens (at the first
    context) and against context (one token), and the whole stubbed forward pass."""
    om.attach(_StubDriver())
    rows: list[dict[str, Any]] = []
    for n, ctx in [(n, contexts[0]) for n in tokens] + [(1, c) for c in contexts[1:]]:
        run = _forward(om, n, ctx)
        run()
        walls = []
        timer = _LayerTimer(om)
        try:
            for _ in range(repeat):
                t0 = time.perf_counter()
                run()
                sync(om.device)
                walls.append(time.perf_counter() - t0)
        finally:
            timer.remove()
        per = [t for v in timer.times.values() for t in v]
        rows.append({"tokens": n, "context": ctx, "layer_s": float(np.median(per)),
                     "forward_s": float(np.median(walls))})
    return {"rows": rows}


def head_bench(om: Any, *, repeat: int = 7) -> float:
    """Seconds of the final norm and LM head on one token."""
    model = om.model
    norm = model.model.norm
    head = model.lm_head
    x = torch.randn(1, 1, om.hidden, device=om.device).to(om.dtype)

    def run() -> None:
        with torch.inference_mode():
            head(norm(x))
    return measure(run, om.device, repeat=repeat)
