"""``simctl advise``: which offloading system and settings for my GPU (see
:mod:`moesim.sim.study.advise`). Registered lazily in :mod:`moesim.sim.cli.main`."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from moesim.sim.cli.study import _DASK, _JOBS, _floats, _show_progress


def advise_cmd(
    model: Annotated[str, typer.Option("--model", help="catalog model (simctl models), a model .yaml file, or an "
                                       "inline mapping such as '{base: mixtral-8x7b, num_layers: 16}'")],
    gpu: Annotated[str, typer.Option("--gpu", help="catalog GPU (simctl hardware) or a hardware .yaml file "
                                     "(a `simctl calibrate` profile, a fitted file's hardware section)")],
    vram: Annotated[float, typer.Option("--vram", help="GPU memory to use, GiB")],
    host_mem: Annotated[float, typer.Option("--host-mem", help="host memory to use, GiB")],
    trace: Annotated[str | None, typer.Option("--trace", help="a trace file (default: the model's synthetic preset)")] = None,
    bits: Annotated[str | None, typer.Option("--bits", help="weight widths to try, bits per weight, e.g. 16,4.5 "
                                             "(default: the model's own, 8.5 and 4.5 below it)")] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="host CPU from the hosts catalog, simctl hardware (default: a "
                                            "generic 16-core, 80 GB/s host, said in the output)")] = None,
    runtime: Annotated[str | None, typer.Option("--runtime", help="runtime-overhead .yaml file for every system "
                                                "(default: each system's catalog runtime)")] = None,
    calibration: Annotated[str | None, typer.Option("--calibration", help="a `simctl fit` file applied to every option")] = None,
    systems: Annotated[str | None, typer.Option("--systems", help="comma-separated: lru, mixtral-offloading, cpu-moe, "
                                                "fiddler, accelerate, ktransformers (default: all)")] = None,
    reserve: Annotated[float, typer.Option("--reserve", help="VRAM kept back for CUDA context, KV cache, activations, GiB (with --context: for all but the KV cache)")] = 1.5,
    host_reserve: Annotated[float, typer.Option("--host-reserve", help="host memory kept back for the OS and framework, GiB")] = 4.0,
    context: Annotated[int, typer.Option("--context", help="tokens already in each request's context (a long chat, a "
                                         "RAG prompt): its KV cache takes VRAM (then --reserve is what is not KV) and "
                                         "attention reads it; 0: --reserve stands for the KV cache")] = 0,
    batch: Annotated[int, typer.Option("--batch", help="requests decoded together")] = 1,
    tokens: Annotated[int, typer.Option("--tokens", help="generated tokens per request of the synthetic workload")] = 64,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="folder for advise.png/svg/csv/md and the points "
                                             "(given again: finished points are reused)")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="list every option (default: the 25 fastest)")] = False,
    merged_only: Annotated[bool, typer.Option("--merged-only", help="leave out options that need an upstream feature "
                                              "not merged yet (llama.cpp's --moe-expert-cache, PR #27861)")] = False,
    jobs: Annotated[int | None, _JOBS] = None,
    dask: Annotated[str | None, _DASK] = None,
    progress: Annotated[bool | None, typer.Option(help="progress bar (default: a bar on a terminal, else a line per few points with the time left)")] = None,
    force: Annotated[bool, typer.Option("--force", help="start afresh when the --out folder holds the points "
                                        "of another advice")] = False,
) -> None:
    """Which flags for my GPU: predicted tokens/s of every setting of each offloading system that fits."""
    from moesim.sim.study.advise import AdviseError, AdviseRequest, run_advice
    from moesim.sim.study.advise_report import print_report, write_outputs

    if jobs is not None and jobs < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--jobs")
    if tokens < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--tokens")
    if batch < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--batch")
    if context < 0:
        raise typer.BadParameter("must be at least 0", param_hint="--context")
    chosen = [s.strip() for s in systems.split(",") if s.strip()] if systems else None
    req = AdviseRequest(model=model, gpu=gpu, vram_gib=vram, host_gib=host_mem, trace=trace,
                        bits=_floats(bits, "--bits"), cpu=cpu, runtime=runtime, calibration=calibration,
                        reserve_gib=reserve, host_reserve_gib=host_reserve, systems=chosen, decode_tokens=tokens,
                        merged_only=merged_only, context_tokens=context, batch=batch)
    if reserve < 0 or host_reserve < 0:
        raise AdviseError("--reserve and --host-reserve must be >= 0")
    if out is not None:
        from moesim.sim.core.atomic import check_own_folder

        check_own_folder(out, option="--out", accept=("advise",))   # before any work; made in run_advice
    work = out / "sweep" if out is not None else Path(tempfile.mkdtemp(prefix="moesim-advise-"))
    try:
        advice = run_advice(req, work, jobs=jobs, dask=dask, progress=_show_progress(progress), home=out,
                            force=force)
        console = Console()
        print_report(req, advice, console, limit=None if show_all else 25)
        if out is not None:
            written = write_outputs(req, advice, out)
            Console(stderr=True).print("wrote " + ", ".join(str(p) for p in written), highlight=False)
    finally:
        if out is None:
            shutil.rmtree(work, ignore_errors=True)
