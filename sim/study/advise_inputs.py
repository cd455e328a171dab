"""What ``simctl advise`` is given, resolved: the GPU (a catalog name or a hardware file) with
the host CPU, a runtime file (``--runtime``), the model (a catalog name, a model YAML file or an inline mapping), and the trace
(a file, or the model's synthetic preset). Bad input raises
:class:`AdviseError` with one line naming the flag."""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from moesim.sim.core.errors import MoesimError


class AdviseError(MoesimError, ValueError):
    """Input ``simctl advise`` cannot use, or nothing fits; the message is one line."""


def hardware_ref(gpu: str, cpu: str | None, vram_gib: float) -> dict[str, Any]:
    """The scenario's ``hardware:`` for ``--gpu`` (catalog name or ``.yaml`` file) and ``--cpu``,
    checked: a file with a field out of range is one line naming the file and the field."""
    from moesim.sim.config.catalog import CatalogError, hardware_names, is_spec_file, load_spec_file
    from moesim.sim.config.catalog.host import host_names

    if is_spec_file(gpu):
        try:
            hw = load_spec_file(Path(gpu).resolve(), "hardware")
        except CatalogError as exc:
            raise AdviseError(f"--gpu: {exc}") from None
        hw.pop("provenance", None)
    elif gpu in hardware_names():
        hw = {"base": gpu}
    else:
        close = difflib.get_close_matches(gpu, hardware_names(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(hardware_names())}"
        raise AdviseError(f"--gpu {gpu}: not in the hardware catalog and not a .yaml file; {hint}")
    if cpu is not None:
        if cpu not in host_names():
            close = difflib.get_close_matches(cpu, host_names(), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(host_names())}"
            raise AdviseError(f"--cpu {cpu}: not in the host catalog (simctl hardware lists it); {hint}")
        hw["cpu"] = cpu
    hw["vram_gib"] = vram_gib
    from moesim.sim.config.catalog import get_hardware

    try:   # a file's fields are checked here, once, with the flag that named it
        get_hardware(hw)
    except (CatalogError, ValueError) as exc:
        raise AdviseError(f"--gpu {gpu}: {exc}") from None
    return hw


def runtime_file(path: str) -> dict[str, Any]:
    """``--runtime FILE``'s runtime spec (its ``runtime`` section, or the whole file), checked: a
    missing file, one that is no spec, or a field out of range is one line naming the file. Every
    reader of the flag (the check before any option runs, the options' scenarios, the
    calibration lines, the NUMA caveat) takes it from here."""
    from moesim.sim.config.catalog import CatalogError, get_runtime, load_spec_file

    if not Path(path).is_file():
        raise AdviseError(f"--runtime {path}: no such file")
    try:
        spec = load_spec_file(Path(path), "runtime")
    except CatalogError as exc:   # it names the file
        raise AdviseError(f"--runtime: {exc}") from None
    try:
        get_runtime(spec)
    except (CatalogError, ValueError) as exc:
        raise AdviseError(f"--runtime {path}: {exc}") from None
    return spec


def model_ref(model: str) -> tuple[dict[str, Any], str]:
    """``--model``: a catalog name, a model ``.yaml`` file (its ``model:`` section, or the whole
    file: the fields of ``simctl models``, or ``base: NAME`` and the fields that differ) or an
    inline YAML mapping (``'{base: mixtral-8x7b, num_layers: 16}'``). Returns the resolved
    scenario ``model:`` mapping (a full spec, or ``{base: NAME}`` for a catalog entry) and a
    name for titles. A bad spec is one line naming it."""
    from moesim.sim.config.catalog import (
        CatalogError,
        get_model,
        is_spec_file,
        load_spec_file,
        model_names,
    )

    if model in model_names():
        return {"base": model}, model
    if is_spec_file(model):
        if not Path(model).is_file():
            raise AdviseError(f"--model {model}: no such file")
        try:
            spec = load_spec_file(Path(model).resolve(), "model")
        except CatalogError as exc:
            raise AdviseError(f"--model: {exc}") from None
        where = f"--model {model}"
    elif model.lstrip().startswith("{"):
        import yaml

        try:
            spec = yaml.safe_load(model)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem", None) or "not YAML"
            raise AdviseError(f"--model {model}: not an inline YAML mapping ({mark})") from None
        if not isinstance(spec, dict):
            raise AdviseError(f"--model {model}: an inline spec must be a mapping, e.g. "
                              "'{base: mixtral-8x7b, num_layers: 16}'")
        spec = {str(k): v for k, v in spec.items()}
        spec.setdefault("name", str(spec.get("base", "custom-model")) + ("-custom" if "base" in spec else ""))
        where = "--model (inline)"
    else:
        close = difflib.get_close_matches(model, model_names(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(model_names())}"
        raise AdviseError(f"--model {model}: not in the model catalog, not a .yaml file and not an inline "
                          f"'{{...}}' mapping; {hint}")
    try:
        resolved = get_model(spec)
    except (CatalogError, ValueError) as exc:
        raise AdviseError(f"{where}: {' '.join(str(exc).split())}") from None
    full = resolved.model_dump(mode="json")
    # the attention shape is left out of a model's dumps (runs without a context keep their
    # bytes), but advise's runs need it (--context, kTransformers' eager attention): carry it
    for key, field in type(resolved).model_fields.items():
        value = getattr(resolved, key)
        if field.exclude and key != "dense_blocks" and value is not None and value != field.default:
            full[key] = value
    full["dense_blocks"] = resolved.dense_blocks
    return full, resolved.name


def at_width(ref: dict[str, Any], bits: float | None) -> tuple[dict[str, Any], Any]:
    """The model reference at ``bits`` per weight (None: its own width; every weight scaled) and
    its resolved spec."""
    from moesim.sim.config.catalog import get_model

    m = get_model(ref)
    native = m.dtype_bytes * 8
    if bits is not None and not math.isclose(bits, native):
        ref = {**ref, "dtype_bytes": bits / 8, "non_expert_bytes": int(m.non_expert_bytes * bits / native)}
        m = get_model(ref)
    return ref, m


def synthetic_trace(ref: dict[str, Any], name: str, requests: int, prompt: int, decode: int) -> tuple[dict[str, Any], str]:
    """The synthetic trace of the model (its preset where there is one) and the words for it."""
    from moesim.sim.config.catalog import get_model
    from moesim.traces.synthetic.generator import PRESETS

    synth: dict[str, Any] = {"requests": requests, "prompt_len": prompt, "decode_len": decode, "seed": 0}
    if "base" in ref and len(ref) == 1 and name in PRESETS:
        synth["preset"] = name
        return {"synthetic": synth}, f"the synthetic {name} preset"
    m = get_model(ref)
    synth.update(model=m.name, num_layers=m.num_layers, num_experts=m.num_experts, top_k=m.top_k)
    return {"synthetic": synth}, f"a synthetic trace of {name} (default router knobs: no preset for this model)"


__all__ = ["AdviseError", "at_width", "hardware_ref", "model_ref", "runtime_file", "synthetic_trace"]
