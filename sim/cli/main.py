"""``simctl``: the command-line interface of moesim.

Every user error (a :class:`sim.errors.MoesimError`, a missing file, a bad option) ends in one
line on stderr and exit status 2; never a traceback.
"""

from __future__ import annotations

import gc

from moesim.sim.cli.gc_pause import collector_paused

with collector_paused():   # the command tree's imports: no garbage, ~10 ms of collector passes
    import json
    import sys
    import time
    from pathlib import Path
    from typing import Annotated

    import typer
    from rich.console import Console
    from rich.table import Table

    from moesim.sim.cli.blas_spin import quiet_blas_workers
    from moesim.sim.cli.lazy_commands import LazyCommand, lazy_group
    from moesim.sim.cli.plugin_option import ALLOW_PLUGINS, grant_plugins
    from moesim.sim.cli.pydantic_plugins import restore as restore_plugin_scan
    from moesim.sim.cli.pydantic_plugins import skip_plugin_scan
    from moesim.sim.core.atomic import Terminated
    from moesim.sim.core.errors import MoesimError
    from moesim.sim.core.escape import terminal, visible

# Commands of other modules, imported and built only when named (simctl run never needs them);
# `simctl --help` lists them where they were registered: quality first, the others last.
_FIRST = [
    # `quality` needs the optional torch extra; the command imports it only when it runs
    LazyCommand("quality", "moesim.sim.cli.quality", "quality",
                help="Run a lossy policy's plans on a real model: KL, next-token agreement, perplexity (extra: tracer)."),
]
_LAST = [
    LazyCommand("calibrate", "moesim.sim.cli.real", "calibrate"),
    LazyCommand("validate", "moesim.sim.cli.real", "validate"),
    LazyCommand("sweep", "moesim.sim.cli.study", "sweep_cmd"),
    LazyCommand("compare", "moesim.sim.cli.study", "compare_cmd"),
    LazyCommand("plot", "moesim.sim.cli.study", "plot_cmd"),
    LazyCommand("report", "moesim.sim.cli.study", "report_cmd"),
    LazyCommand("table", "moesim.sim.cli.study", "table_cmd"),
    LazyCommand("curve", "moesim.sim.study.curve", "curve_cmd"),
    LazyCommand("advise", "moesim.sim.cli.advise", "advise_cmd"),
    LazyCommand("fit", "moesim.sim.cli.fit", "fit_cmd"),
    LazyCommand("trace", "moesim.traces.cli", "app", group=True,
                help="Record, import, synthesise and inspect moe-trace files."),
    LazyCommand("model", "moesim.traces.tiny.model_cli", "app", group=True,
                help="The small MoEs trained in this repository (tiny-moe, fine-moe): train one, find it."),
]


def _app() -> typer.Typer:
    """The app (the lazy commands are built with its settings)."""
    return app


app = typer.Typer(
    name="simctl",
    help="moesim: trace-driven simulator of MoE inference with expert offloading.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=lazy_group(_app, _FIRST, _LAST),
)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a key: --set cache.rate=0.25 (repeatable)")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write config.yaml, metrics.json, steps.parquet, timeline.json here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print metrics.json to stdout instead of the summary")] = False,
    timeline: Annotated[bool, typer.Option("--timeline", help="also write timeline.json, the GPU/CPU/PCIe activity as a Chrome trace (with --out)")] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bar (default: on a terminal)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing non-empty --out folder")] = False,
    baselines: Annotated[bool, typer.Option(help="the summary's speed-up over lru and no-cache (the same scenario, "
                                            "on the fast path)")] = True,
    allow_plugins: Annotated[bool, ALLOW_PLUGINS] = False,
) -> None:
    """Run one scenario and print its summary."""
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.core.atomic import check_target
    from moesim.sim.run.outputs import print_summary, write_outputs
    from moesim.sim.run.runner import prepare_run

    _resume_gc()
    grant_plugins(allow_plugins)

    if timeline and out is None:
        raise MoesimError("--timeline writes timeline.json into the --out folder: give --out too")
    if out is not None:
        check_target(out, option="--out", folder=True, force=force)
    loaded = load_scenario(scenario, set_ or [])
    err = Console(stderr=True)
    show = err.is_terminal if progress is None else progress
    want_timeline = timeline and out is not None
    if show:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("iterations"), TimeRemainingColumn(), console=err, transient=True) as bar:
            task = bar.add_task(loaded.scenario.name, total=None)
            last = [0.0]

            def tick(done: int, total: int) -> None:
                now = time.monotonic()
                if now - last[0] > 0.1 or done == total:
                    last[0] = now
                    bar.update(task, completed=done, total=total)

            prepared = prepare_run(loaded, timeline=want_timeline, steps=out is not None, progress=tick)
            result = prepared.run()
    else:
        prepared = prepare_run(loaded, timeline=want_timeline, steps=out is not None)
        result = prepared.run()
    if out is not None:
        write_outputs(result, out, timeline=want_timeline, force=force)
    if json_out:
        print(json.dumps(result.metrics, indent=2, sort_keys=True))
    else:
        from moesim.sim.run.baselines import speedups

        console = _console()
        state = prepared.engine.state
        print_summary(result, console, speedups(loaded, result, state.trace, state.workload) if baselines else None)
        if out is not None:
            console.print(f"wrote {terminal(out)}/config.yaml, metrics.json, steps.parquet"
                          + (", timeline.json" if want_timeline else ""))


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files."""
    from moesim.sim.config.scenario import scenario_schema

    print(json.dumps(scenario_schema(), indent=2))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moesim")
    except PackageNotFoundError:
        return "unknown (not installed)"


@app.callback(invoke_without_command=True)
def _main(
    ctx: typer.Context,
    show_version: Annotated[bool, typer.Option("--version", help="print the moesim version and exit")] = False,
) -> None:
    """moesim: trace-driven simulator of MoE inference with expert offloading."""
    if ctx.invoked_subcommand != "run":   # run resumes it after its own imports
        _resume_gc()
    if show_version:
        print(f"moesim {_version()}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(0)


@app.command()
def policies(
    name: Annotated[str | None, typer.Argument(help="one policy: its parameters, paper and the trace columns it needs")] = None,
) -> None:
    """List the registered policies, or describe one (simctl policies NAME)."""
    from moesim.sim.cli.policy_info import describe_policy, policy_table

    console = Console() if sys.stdout.isatty() else Console(width=80)
    console.print(describe_policy(name) if name is not None else policy_table())
    if name is None:
        console.print("simctl policies NAME: parameters, paper, what the trace must contain")


@app.command()
def models() -> None:
    """List the model catalog."""
    from moesim.sim.config.catalog import get_model, model_names

    t = Table("model", "MoE layers", "experts", "top-k", "shared", "expert MB", "routed GB", "non-expert GB")
    for name in model_names():
        m = get_model(name)
        t.add_row(name, str(m.num_layers), str(m.num_experts), str(m.top_k), str(m.num_shared_experts),
                  f"{m.expert_bytes / 1e6:.1f}", f"{m.routed_bytes / 1e9:.1f}", f"{m.non_expert_bytes / 1e9:.2f}")
    _console().print(t)


@app.command()
def hardware(
    name: Annotated[str | None, typer.Argument(help="a catalog entry or a profile YAML file: show where each number comes from")] = None,
) -> None:
    """List the hardware and host CPU catalogs, or show one entry's numbers and their sources."""
    from moesim.sim.config.catalog import (
        CatalogFieldError,
        get_cpu,
        get_hardware,
        hardware_names,
        host_names,
        is_spec_file,
        load_spec_file,
    )

    if name is not None and name in host_names():
        cpu = get_cpu(name)
        t = Table("field", "value", "source", title=f"host {name}: {cpu.source}")
        for field, value in cpu.model_dump(exclude={"name", "source", "sources"}, exclude_none=True).items():
            t.add_row(field, str(value), cpu.sources.get(field, "default of CpuSpec"))
        _console().print(t)
        return
    if name is not None:
        if is_spec_file(name) and Path(name).is_file():
            from moesim.sim.config.fitted import print_fit_file

            if print_fit_file(name, _console()) and not _has_section(name, "hardware"):
                return   # a fit over several hardware: its values are printed above
        try:
            h = get_hardware(load_spec_file(name, "hardware") if is_spec_file(name) else name)
        except CatalogFieldError as exc:
            raise MoesimError(f"{name}: {exc}") from None
        t = Table("field", "value", "source", title=f"{h.name}: {h.source or 'no source stated'}")
        for field, value in h.model_dump(exclude={"name", "source", "sources"}, exclude_none=True).items():
            t.add_row(field, str(value), h.source_of(field, name if is_spec_file(name) else "the entry"))
        _console().print(t)
        if is_spec_file(name):
            _print_runtime_section(name)
        return
    t = Table("hardware", "VRAM GiB", "PCIe GB/s", "pageable GB/s", "copy engines", "TFLOP/s", "HBM GB/s",
              "calibrated", "source")
    for name_ in hardware_names():
        h = get_hardware(name_)
        t.add_row(name_, f"{h.vram_gib:g}", f"{h.pcie_gbps:g}", f"{h.pageable_rate_gbps:g}", str(h.copy_engines),
                  f"{h.peak_tflops:g}", f"{h.hbm_gbps:g}", "yes" if h.costs else "no", h.source or "-")
    _console().print(t)
    t = Table("host (cpu:)", "cores", "memory GB/s (all sockets)", "per thread GB/s", "TFLOP/s (all sockets)", "source")
    for name_ in host_names():
        c = get_cpu(name_)
        t.add_row(name_, str(c.cores), f"{c.sockets * c.mem_gbps:g}", f"{c.thread_gbps:g}" if c.thread_gbps else "-",
                  f"{c.sockets * c.tflops:g}", c.source)
    _console().print(t)
    _console().print("simctl hardware NAME (a GPU, a host, or a profile .yaml) shows the source of every number; "
                     "pick a host with hardware: {base: GPU, cpu: HOST}")


def _has_section(path: str, section: str) -> bool:
    from moesim.sim.core.yamlio import load_yaml_file

    data = load_yaml_file(path)
    return isinstance(data, dict) and section in data


def _print_runtime_section(path: str) -> None:
    """The ``runtime:`` section of a profile file, when it has one, with its source."""
    from moesim.sim.config.catalog import get_runtime, load_spec_file

    try:
        rt = get_runtime(load_spec_file(path, "runtime"))
    except MoesimError:
        return   # a hardware-only file
    t = Table("runtime field", "value (us)", title=f"runtime {rt.name}")
    for field, value in rt.model_dump(exclude={"name", "source"}).items():
        if value is None:
            continue   # host_memory unset: the policy decides
        t.add_row(field, value if isinstance(value, str) else f"{value:g}")   # a str: host_memory, a Literal
    _console().print(t)
    _console().print(f"source: {rt.source or 'no source stated'}")


def _console() -> Console:
    """stdout console; wide when piped, so tables are not cut to 80 columns. Emoji codes are
    printed as written: a name of the user's such as ``a:fire:b`` is shown, not turned into an
    emoji (and rich's emoji table, ~2 ms to load, is not loaded for the summary)."""
    return Console(emoji=False) if sys.stdout.isatty() else Console(width=200, emoji=False)


_gc_paused = False
_gc_frozen = False


def _resume_gc() -> None:
    """Turn the cyclic collector back on if :func:`main` paused it; the first time in a process,
    after moving everything allocated so far (modules, classes, the command tree) out of its
    sight for good."""
    global _gc_paused, _gc_frozen
    if _gc_paused:
        _gc_paused = False
        if not _gc_frozen:
            _gc_frozen = True
            gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``simctl`` console script. The cyclic collector pauses while the
    command line is parsed and the command's modules load (hundreds of thousands of objects, no
    garbage; its passes cost a tenth of a short run) and resumes before the command works;
    numpy's BLAS workers, not yet started, will sleep instead of spinning (:mod:`.blas_spin`),
    and pydantic looks for no plugins (:mod:`.pydantic_plugins`)."""
    global _gc_paused
    quiet_blas_workers(sys.argv[1:] if argv is None else argv)
    skipped_scan = skip_plugin_scan()
    if gc.isenabled():
        gc.disable()
        _gc_paused = True
    try:
        # the command line as typed, for the studies' record of what made them (study.json)
        command = ["simctl", *(sys.argv[1:] if argv is None else argv)]
        rv = app(args=argv, prog_name="simctl", standalone_mode=False, obj={"argv": command})
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        print("simctl: aborted", file=sys.stderr)
        return 130
    except MoesimError as exc:   # its text may quote a file's: control characters shown, never sent
        print(f"simctl: error: {visible(exc)}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"simctl: error: {visible(exc.filename or exc)}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simctl: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("simctl: terminated (SIGTERM); no partial output left", file=sys.stderr)
        return 143
    except PermissionError as exc:
        # an output or input the OS refuses (a read-only mount, a folder made unwritable
        # meanwhile): the user's environment, not a bug
        print(f"simctl: error: {visible(exc.filename or exc)}: permission denied", file=sys.stderr)
        return 2
    except Exception as exc:
        # click's usage errors (typer vendors its own click in recent releases, so match by shape)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            if type(exc).__name__ == "NoArgsIsHelpError":
                print(exc.ctx.get_help())  # type: ignore[attr-defined]
                return 0
            msg = " ".join(str(exc.format_message()).split())
            print(f"simctl: error: {visible(msg)}", file=sys.stderr)
            return int(exc.exit_code)
        # anything else is a bug in moesim (or in a policy's code), never bad input: keep the
        # traceback so that it can be fixed
        import traceback

        traceback.print_exc()
        print(f"simctl: internal error ({type(exc).__name__}): this is a bug; please report it with "
              "the traceback above", file=sys.stderr)
        return 1
    finally:
        _resume_gc()
        restore_plugin_scan(skipped_scan)
    return int(rv) if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
