"""Where ``simctl advise``'s numbers come from, in the lines it prints under ``calibration:``:
the GPU's link, memory and compute with their sources, the host CPU, each runtime profile the
options run (and the fields a setting changes of it), and a ``simctl fit`` file's held-out
error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from moesim.sim.study.advise_host import cpu_words, kernel_lines
from moesim.sim.study.advise_inputs import runtime_file
from moesim.sim.study.advise_options import HOST_KV_RUNTIME, Option


def calibration_lines(req: Any, base: dict[str, Any], options: list[Option]) -> list[str]:
    """Where the predictions' numbers come from: the GPU's link, memory and compute, the host
    CPU, each runtime profile used, and a fit's held-out error (``req``: the
    :class:`moesim.sim.study.advise.AdviseRequest`, which imports this module)."""
    from moesim.sim.config.catalog import get_runtime
    from moesim.sim.config.scenario import load_scenario_data

    loaded = load_scenario_data(copy.deepcopy(base), source="simctl advise", base_dir=Path.cwd())
    hw = loaded.hardware_spec()
    where = Path(req.gpu).name if req.gpu.endswith((".yaml", ".yml")) else f"catalog entry {req.gpu}"
    lines = [f"hardware {hw.name} ({where}): {hw.source or 'no source stated'}"]
    for f, unit in (("pcie_gbps", "GB/s pinned"), ("pageable_gbps", "GB/s pageable"), ("hbm_gbps", "GB/s HBM"),
                    ("peak_tflops", "TFLOP/s")):
        value = getattr(hw, f) if f != "pageable_gbps" else hw.pageable_rate_gbps
        lines.append(f"  {f} {value:g} {unit}: {hw.source_of(f, where)}")
    cpu = hw.cpu
    lines.append(f"  host cpu {cpu.name}: {cpu_words(cpu)}: {cpu.source or 'no source stated'}")
    if cpu.numa_unaware_gbps is not None:
        lines.append(f"    numa_unaware_gbps {cpu.numa_unaware_gbps:g} GB/s a socket (runtimes that place no weights per "
                     f"NUMA node): {cpu.sources.get('numa_unaware_gbps', 'no source stated')}")
    if req.runtime:
        rt = get_runtime(runtime_file(req.runtime))
        lines.append(f"runtime (every system) {rt.name} ({req.runtime}): {rt.source or 'no source stated'}")
        lines += kernel_lines(rt)
        lines += override_lines(options)
    else:
        for name in dict.fromkeys(o.runtime for o in options):
            users = ", ".join(dict.fromkeys(o.system for o in options if o.runtime == name))
            rt = get_runtime(name)
            lines.append(f"runtime {name} ({users}): {rt.source or 'no source stated'}")
            lines += kernel_lines(rt)
            lines += override_lines([o for o in options if o.runtime == name])
    for label, path in (("calibration", req.calibration), ("--gpu", req.gpu), ("--runtime", req.runtime)):
        held = fit_error(path) if path else None
        if held:
            lines.append(f"{label} {Path(path or '').name}: {held}")
    if not any("held-out" in line for line in lines):
        lines.append("no `simctl fit` file given: the catalog figures are spec sheets and derivations, not fitted "
                     "to this machine; the error bands beside each number say how far they were from published rows")
    return lines


def override_lines(options: list[Option]) -> list[str]:
    """One line for each set of runtime fields that settings among ``options`` change
    (:attr:`Option.runtime_overrides`, applied to the catalog runtime or to ``--runtime``'s file
    alike), and why."""
    lines = []
    for changed in dict.fromkeys(str(o.runtime_overrides) for o in options if o.runtime_overrides):
        why = ("llama.cpp's -nkvo: the KV cache in host memory, attention on the CPU: sim/study/advise_nkvo.py"
               if changed == str(HOST_KV_RUNTIME) else
               "kTransformers' experts on the GPU, --use_cuda_graph False: sim/study/advise_ktransformers.py")
        lines.append(f"  with {changed} where a setting says so ({why})")
    return lines


def fit_error(path: str) -> str | None:
    """A ``simctl fit`` file's name, source and held-out error in one line (None for any other file)."""
    from moesim.sim.core.yamlio import YamlError, load_yaml_file

    if not path.endswith((".yaml", ".yml")) or not Path(path).is_file():
        return None
    try:
        data = load_yaml_file(Path(path))
    except YamlError:
        return None
    fit = data.get("fit") if isinstance(data, dict) else None
    if not isinstance(fit, dict):
        return None
    held = fit.get("held_out") or {}
    if isinstance(held, dict) and held.get("rows"):
        err = (f"held-out error over {held['rows']} rows: median {held.get('median_abs_error_pct', float('nan')):.1f}%, "
               f"max ratio {held.get('max_ratio', float('nan')):.2f}x")
    else:
        err = "held-out error: the fit held out no rows"
    return f"fit {fit.get('name', '?')} ({fit.get('source', 'no source')}): {err}"


__all__ = ["calibration_lines", "fit_error", "override_lines"]
