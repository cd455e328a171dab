"""``simctl calibrate`` and ``simctl validate``: the commands that run a real model (the
optional ``tracer`` extra: torch, transformers, safetensors). :mod:`moesim.sim.cli.main` loads this
module only when one of them is named."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from moesim.sim.cli.plugin_option import ALLOW_PLUGINS, grant_plugins
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.install_hint import extra_hint
from moesim.sim.core.lib_warnings import quiet_library_warnings


def _console() -> Console:
    """stdout console; wide when piped, so tables are not cut to 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def require_tracer(command: str) -> None:
    """One line and exit 2, instead of an import traceback, when a command that runs a real
    model is used without the optional ``tracer`` extra (torch, transformers, safetensors)."""
    import importlib.util

    missing = [m for m in ("torch", "transformers", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise MoesimError(f"simctl {command} needs the tracer extra ({', '.join(missing)} not installed): "
                          + extra_hint("tracer", torch=True))


@quiet_library_warnings()
def calibrate(
    out: Annotated[Path, typer.Option("--out", "-o", help="profile YAML to write (use it as hardware: and runtime: in a scenario)")],
    model: Annotated[str | None, typer.Option("--model", help="model directory / config JSON, catalog model name (tiny-moe: the bundled trained model; others: random weights of that shape), or an inline YAML spec (default: tiny-moe)")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N")] = "cpu",
    quick: Annotated[bool, typer.Option("--quick", help="fewer sizes and repeats (seconds)")] = False,
    context: Annotated[int, typer.Option("--context", min=1, help="context length of the non-MoE layer fit")] = 32,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch threads on CPU")] = 1,
    trace: Annotated[Path | None, typer.Option("--trace", help="a trace recorded from this model: the executor-step runs replay the decode of its last 2 requests (default: random routing)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing profile file")] = False,
) -> None:
    """Measure copies, expert and layer compute, and framework overhead with torch; write a profile."""
    require_tracer("calibrate")
    from moesim.sim.core.atomic import check_target
    from moesim.sim.real.calibration.profile import calibrate as run_calibration
    from moesim.sim.real.calibration.profile import write_profile
    from moesim.sim.real.executor.model import load, model_argument
    from moesim.traces.tracer.model_loading import resolve_device

    if out.suffix.lower() not in (".yaml", ".yml"):
        raise MoesimError(f"--out {out}: a profile file must end in .yaml or .yml")
    from moesim.sim.config.catalog import get_model

    check_target(out, option="--out", folder=False, force=force)
    ref, spec = model_argument(model, get_model("tiny-moe"))
    routed = None
    if trace is not None:
        from moesim.traces.format.trace_file import read_trace

        routed = read_trace(trace)   # a missing or malformed trace is one line, before the model loads
    om = load(ref, spec, resolve_device(device))
    routing = None
    if routed is not None:
        from moesim.sim.run.profile import trace_requests
        from moesim.sim.run.runner import check_shapes

        check_shapes(routed, om.spec, f"--trace {trace}")
        routing = (routed, trace_requests(routed)[-2:])
    cmd = (f"simctl calibrate --out {out} --device {device} --context {context} --threads {threads}"
           + (f" --model {shlex.quote(model)}" if model else "") + (f" --trace {trace}" if trace else "")
           + (" --quick" if quick else ""))
    prof = run_calibration(om, quick=quick, context=context, threads=threads, command=cmd, routing=routing)
    write_profile(prof, out, force=force)
    hw, rt = prof["hardware"], prof["runtime"]
    c = hw["costs"]
    _console().print(f"{prof['provenance']['device']}: copies {hw['pcie_gbps']:.2f} GB/s + {hw['pcie_latency_us']:.1f} us, "
                     f"expert {c['expert_us']:.1f} us (+{c['expert_us_per_token']:.1f}/token), layer {c['layer_us']:.1f} us, "
                     f"head {c['head_us']:.1f} us, overhead {rt['layer_us']:.1f} us/layer + {rt['iteration_us']:.1f} us/iteration, "
                     f"{rt['demand_load_us']:.1f} us per demand load, {rt['prefetch_issue_us']:.1f} us per prefetch issued")
    _console().print(f"wrote {out}")


@quiet_library_warnings()
def validate(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a key (repeatable)")] = None,
    profile: Annotated[Path | None, typer.Option("--profile", help="an existing calibration profile (default: calibrate first)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model directory / config JSON, catalog name, or 'random' (default: the scenario's model: the bundled trained tiny-moe for model tiny-moe, else a random Mixtral of its shape)")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N")] = "cpu",
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for the profile and validation.json")] = Path("runs/validate"),
    quick: Annotated[bool, typer.Option("--quick", help="quick calibration")] = False,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="executor runs; each timing is the best of them")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
    force: Annotated[bool, typer.Option("--force", help="replace an existing non-empty --out folder")] = False,
    allow_plugins: Annotated[bool, ALLOW_PLUGINS] = False,
) -> None:
    """Run a scenario in the simulator (calibrated) and on the real executor; print both and the error."""
    grant_plugins(allow_plugins)
    require_tracer("validate")
    from moesim.sim.config.catalog import load_spec_file
    from moesim.sim.config.scenario import load_scenario
    from moesim.sim.core.atomic import atomic_folder, check_target
    from moesim.sim.real.calibration.profile import calibrate as run_calibration
    from moesim.sim.real.calibration.profile import write_profile
    from moesim.sim.real.executor.model import load, model_argument
    from moesim.sim.real.validate import (
        calibration_inputs,
        compare,
        execute_repeated,
        format_rows,
        simulate,
    )
    from moesim.sim.run.runner import load_trace
    from moesim.traces.tracer.model_loading import resolve_device

    loaded = load_scenario(scenario, set_ or [])
    check_target(out, option="--out", folder=True, force=force)
    if profile is not None:
        load_spec_file(profile, "hardware")   # a missing or malformed file is one line, before any work
    trace = load_trace(loaded)
    ref, spec = model_argument(model, loaded.model_spec(trace.model.name))
    om = load(ref, spec, resolve_device(device))
    with atomic_folder(out, option="--out", force=force, kind="validate") as tmp:
        used = profile
        if profile is None:
            cmd = f"simctl validate {scenario} --device {device}" + (" --quick" if quick else "")
            context, routing = calibration_inputs(loaded, trace)
            used = write_profile(run_calibration(om, quick=quick, command=cmd, context=context, routing=routing),
                                 tmp / "profile.yaml")
            profile = out / "profile.yaml"
        assert used is not None
        real = execute_repeated(loaded, om, used, trace, repeats=repeats)
        sim = simulate(loaded, om.spec, used, trace)
        rows = compare(sim, real)
        (tmp / "validation.json").write_text(json.dumps({"scenario": str(scenario), "profile": str(profile),
                                                          "rows": rows, "simulated": sim, "measured": real},
                                                         indent=2, default=str))
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table("metric", "simulated", "measured (best of runs)", "error", "", title=f"{loaded.scenario.name}: policy {real['policy']}, {repeats} executor run(s), "
              f"profile {profile}, {real['device']} ({real['copy_engine']} copies)")
    for r in format_rows(rows):
        t.add_row(*r)
    _console().print(t)
