"""What the executor's host paths cost on a GPU machine, each measured two ways, to tell which way
``simctl calibrate`` must time them (the ways the executor runs them):

* a host-to-device copy from pageable memory of one expert and of one layer's experts: issued
  non-blocking on a side stream (how the calibration timed it until issue 32 item 8) and blocking
  on the compute stream (``tensor.to(device)``, how accelerate and the executor's pageable path
  copy);
* one expert applied to one token on the host's cores (``--threads``) with its weights in
  pageable memory (how the calibration timed it) and in pinned memory (the executor's host pool
  on a GPU machine), cycling over one layer's experts;
* the same expert right after the host has waited ``--gaps`` milliseconds, asleep or blocked on
  the GPU (a kernel that spins that long, then a synchronise: how the executor waits for the
  activations a CPU layer reads), to see whether the host's threads pay to start again after a
  pause (the calibration times experts back to back).

    python benchmarks/host_paths_probe.py [--threads 8] [--model '{base: mixtral-8x7b}'] [--gaps 0 1 3]

Prints one markdown table of medians (GB/s and ms). Speed figures, never assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    import torch
    import yaml

    from moesim.sim.config.catalog import get_model
    from moesim.sim.real.calibration.timing import measure
    from moesim.sim.real.executor.kernels import apply_expert, expert_numel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--model", default="{base: mixtral-8x7b}")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gaps", nargs="*", type=float, default=[0.0, 0.5, 1.0, 2.0, 4.0],
                    help="pauses before a host expert, milliseconds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_paths_probe: needs a CUDA device", file=sys.stderr)
        return 2
    spec = get_model(yaml.safe_load(args.model))
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    H, Im, E = spec.hidden_size, spec.expert_intermediate_size, spec.num_experts
    n = expert_numel(H, Im)
    eb = n * 2
    layer = torch.empty((E, n), dtype=dtype).normal_()
    pinned = torch.empty((E, n), dtype=dtype, pin_memory=True).copy_(layer)
    rows: list[tuple[str, str, float]] = []

    def copies(label: str, src: torch.Tensor) -> None:
        dst = torch.empty(src.shape, dtype=dtype, device=dev)
        side = torch.cuda.Stream(device=dev)

        def nonblocking() -> None:
            with torch.cuda.stream(side):
                dst.copy_(src, non_blocking=True)
            side.synchronize()

        def blocking() -> None:
            dst.copy_(src)
        for how, fn in (("non-blocking, side stream", nonblocking), ("blocking, compute stream", blocking)):
            s = measure(fn, dev, repeat=args.repeat)
            rows.append((f"H2D {label}, pageable, {how}", f"{src.numel() * 2 / 1e6:.0f} MB", src.numel() * 2 / s / 1e9))
    copies("one expert", layer[0])
    copies("one layer", layer)
    dst = torch.empty((E, n), dtype=dtype, device=dev)
    s = measure(lambda: dst.copy_(pinned, non_blocking=True), dev, repeat=args.repeat)
    rows.append(("H2D one layer, pinned, non-blocking, compute stream", f"{E * eb / 1e6:.0f} MB", E * eb / s / 1e9))
    old = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        x = torch.randn(1, H).to(dtype)
        w = torch.rand(1, 2)
        tok = torch.zeros(1, dtype=torch.long)
        slot = torch.zeros(1, dtype=torch.long)
        for label, pool in (("pageable", layer), ("pinned", pinned)):
            out = torch.zeros_like(x)

            def one(pool: Any = pool, out: torch.Tensor = out, k: list[int] = [0]) -> None:  # noqa: B006
                k[0] += 1
                with torch.inference_mode():
                    apply_expert(out, x, w, tok, slot, pool[k[0] % E], H, Im)
            s = measure(one, torch.device("cpu"), repeat=max(args.repeat, 2 * E))
            rows.append((f"one expert on the host, 1 token, {args.threads} threads, weights {label}",
                         f"{eb / 1e6:.0f} MB", s * 1e3))
        cycles_per_ms = 1.98e6   # the H100/H200 boost clock; the measured wait is printed beside
        for how in ("asleep", "blocked on the GPU"):
            for gap in args.gaps:
                times, waits = [], []
                for i in range(2 * E + 2):
                    t_w = time.perf_counter()
                    if how == "asleep":
                        time.sleep(gap / 1e3)
                    else:
                        torch.cuda._sleep(int(gap * cycles_per_ms))
                        torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        apply_expert(out, x, w, tok, slot, pinned[i % E], H, Im)
                    if i >= 2:
                        times.append(time.perf_counter() - t0)
                        waits.append(t0 - t_w)
                rows.append((f"one expert on the host, 1 token, pinned weights, after {how} "
                             f"{statistics.median(waits) * 1e3:.2f} ms (asked {gap:g})",
                             f"{eb / 1e6:.0f} MB", statistics.median(times) * 1e3))
    finally:
        torch.set_num_threads(old)
    print(f"# Host paths on {torch.cuda.get_device_name(dev)} (torch {torch.__version__}, {spec.name} shape)\n")
    print("| what | size | GB/s (copies) or ms (experts) |\n|---|---|---|")
    for what, size, v in rows:
        print(f"| {what} | {size} | {v:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
