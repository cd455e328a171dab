"""Sweep files: a base scenario plus the keys to vary, expanded into validated points.

A sweep file (YAML)::

    name: flame-cache-rate
    base: ../quickstart.yaml           # a scenario file (relative to this file) or an inline mapping
    set: {workload.requests: 4}        # fixed overrides applied to every point (optional)
    grid:                              # cartesian product over every listed key
      policy: all                      # "all": every registered policy
      cache.rate: [0.125, 0.25, 0.5]
    zip:                               # lists of one length, varied together (one axis)
      hardware.pcie_gbps: [16, 32]
      hardware.pcie_latency_us: [10, 5]

``zip`` may also be a list of such mappings (several zipped axes). The points are the product of
the grid axes and the zipped axes, in file order (the last key varies fastest). Keys are dotted
scenario paths, as ``simctl run --set``: ``cache.rate``, ``hardware.pcie_gbps``,
``policy.params.theta``, ``workload.batch_size``, ``seed``... Values are any YAML value.

Every key is checked against the scenario schema (an unknown key gets a did-you-mean) and
every point is validated as a scenario, with its policy built, before anything runs. Then each
policy's setup needs are weighed (:mod:`moesim.sim.study.needs`): the paper's defaults for what
the scenario leaves unset are applied (``Point.applied`` says what), and a point whose policy
cannot run as its paper meant it on this trace is marked ``n/a`` (``Point.unmet`` says why) and
is not run.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.limits import SWEEP_POINTS
from moesim.sim.core.yamlio import load_yaml_file

ALL = "all"


class SweepError(MoesimError, ValueError):
    """A sweep file that cannot run; the message names the file and the key."""


class SweepSpec(BaseModel):
    """The content of a sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("sweep", description="name of the study, used for the default output folder")
    base: str | dict[str, Any] = Field(description="scenario file (relative to the sweep file) or an inline scenario")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides applied to every point: {dotted.key: value}")
    grid: dict[str, list[Any] | str] = Field(
        default_factory=dict, description="cartesian product: {dotted.key: [values]}; policy: all for every registered policy")
    zip: dict[str, list[Any]] | list[dict[str, list[Any]]] = Field(
        default_factory=list, description="keys varied together: {dotted.key: [values]} of one length, or a list of such groups")

    @field_validator("grid")
    @classmethod
    def _lists(cls, v: dict[str, list[Any] | str]) -> dict[str, list[Any] | str]:
        for key, values in v.items():
            if isinstance(values, str) and not (values == ALL and key in ("policy", "policy.name")):
                raise ValueError(f"{key}: expected a list of values (or 'all' for policy)")
            if isinstance(values, list) and not values:
                raise ValueError(f"{key}: empty list")
        return v

    def zip_groups(self) -> list[dict[str, list[Any]]]:
        """``zip`` as a list of groups."""
        return [self.zip] if isinstance(self.zip, dict) else list(self.zip)


@dataclass
class Point:
    """One scenario of a sweep: its index, the swept values and the validated scenario."""

    index: int
    params: dict[str, Any]
    data: dict[str, Any]
    config_hash: str
    source: str
    base_dir: Path
    bound: bool = False
    policy: str = ""
    kind: str = "lossless"
    applied: list[str] = field(default_factory=list)
    unmet: str | None = None


@dataclass
class Sweep:
    """An expanded sweep: its spec, where it came from and its points in order."""

    spec: SweepSpec
    source: str
    base_dir: Path
    points: list[Point]

    @property
    def param_keys(self) -> list[str]:
        """The swept keys, in column order."""
        keys: list[str] = list(self.spec.grid)
        for group in self.spec.zip_groups():
            keys.extend(group)
        return keys


# --- key checking -------------------------------------------------------------------------------
def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``CacheSpec`` or ``str | PolicySpec``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def check_key(key: str, where: str) -> None:
    """Raise :class:`SweepError` unless ``key`` is a dotted path of the scenario schema.

    ``model.*``, ``hardware.*`` and ``runtime.*`` are checked against the catalog specs (plus ``base``);
    ``policy.params.*`` is checked later, against the policy of each point.
    """
    from moesim.sim.config.catalog import CostsSpec, HardwareSpec, ModelSpec, RuntimeSpec
    from moesim.sim.config.scenario import PolicySpec, Scenario

    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise SweepError(f"{where}: {key!r}: not a dotted scenario key")
    models: dict[str, type[BaseModel]] = {"model": ModelSpec, "hardware": HardwareSpec, "costs": CostsSpec,
                                          "policy": PolicySpec, "runtime": RuntimeSpec}
    model: type[BaseModel] | None = Scenario
    for i, part in enumerate(parts):
        if model is None:
            return  # a free mapping (policy params, synthetic trace parameters): checked when validated
        known = list(model.model_fields)
        if model in (ModelSpec, HardwareSpec, RuntimeSpec):
            known.append("base")
        if part not in known:
            prefix = ".".join(parts[:i])
            full = [f"{prefix}.{k}" if prefix else k for k in known]
            close = difflib.get_close_matches(key, full, n=1) or difflib.get_close_matches(part, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(full)}"
            raise SweepError(f"{where}: {key}: unknown scenario key{hint}")
        if part == "base":
            model = None
            continue
        model = models.get(part) if part in models else _model_of(model.model_fields[part].annotation)
        if part == "trace":
            model = None


# --- loading and expansion ----------------------------------------------------------------------
def _trace_model(loaded: Any) -> tuple[str, dict[str, int] | None]:
    """The model name and shape a point's trace file records (its footer only), so that a model
    outside the catalog resolves as the run will resolve it; ``("", None)`` without a file."""
    from moesim.sim.run.runner import trace_shape
    from moesim.traces.format.trace_file import TraceError, read_meta

    path = loaded.trace_path()
    if path is None or not path.is_file():
        return "", None
    try:
        model = read_meta(path).model
    except TraceError:
        return "", None     # the point's run names the broken file
    return model.name, trace_shape(model)


def _axes(spec: SweepSpec, source: str) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    """Each axis: its keys and its value tuples."""
    from moesim.policies.contract.registry import policy_names

    axes: list[tuple[list[str], list[tuple[Any, ...]]]] = []
    for key, values in spec.grid.items():
        check_key(key, f"{source}: grid")
        vals = policy_names() if values == ALL else values
        assert isinstance(vals, list)
        axes.append(([key], [(v,) for v in vals]))
    for n, group in enumerate(spec.zip_groups()):
        if not group:
            continue
        lengths = {k: len(v) for k, v in group.items()}
        for key in group:
            check_key(key, f"{source}: zip")
        if len(set(lengths.values())) != 1:
            detail = ", ".join(f"{k} has {n_}" for k, n_ in lengths.items())
            raise SweepError(f"{source}: zip group {n + 1}: lists of different lengths ({detail})")
        if 0 in lengths.values():
            raise SweepError(f"{source}: zip group {n + 1}: empty lists")
        axes.append((list(group), list(zip(*group.values(), strict=True))))
    seen: set[str] = set()
    for keys, _ in axes:
        for k in keys:
            if k in seen:
                raise SweepError(f"{source}: {k}: swept twice (in grid and zip, or in two zip groups)")
            seen.add(k)
    for k in spec.set:
        check_key(k, f"{source}: set")
    return axes


def overrides_for(values: dict[str, Any]) -> list[str]:
    """``{dotted.key: value}`` as ``--set`` items (JSON is valid YAML, so any value round-trips)."""
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


def _policy_axes(spec: SweepSpec) -> set[str]:
    """The swept keys that vary with the policy: a grid key of the policy, or every key of a zip
    group holding one (a study's comparison groups are the points alike but for these)."""
    def is_policy(key: str) -> bool:
        return key == "policy" or key.startswith("policy.")

    keys = {k for k in spec.grid if is_policy(k)}
    for group in spec.zip_groups():
        if any(is_policy(k) for k in group):
            keys.update(group)
    return keys


def expand(spec: SweepSpec, *, source: str, base_dir: Path, extra_sets: list[str] | None = None) -> Sweep:
    """Expand and validate every point of ``spec``, then weigh each policy's setup needs (see
    the module docstring); raise :class:`SweepError` on the first bad point."""
    from moesim.policies.contract.plugins import load_plugins
    from moesim.policies.contract.registry import PolicyError, make_policy
    from moesim.sim.config.scenario import ScenarioError, apply_overrides, load_scenario_data
    from moesim.sim.study.needs import fit_points

    axes = _axes(spec, source)
    SWEEP_POINTS.check(math.prod(len(vals) for _, vals in axes), f"{source}: the grid")
    if isinstance(spec.base, str):
        base_path = (base_dir / spec.base) if not Path(spec.base).is_absolute() else Path(spec.base)
        if not base_path.is_file():
            raise SweepError(f"{source}: base: {spec.base}: no such scenario file")
        base_data = load_yaml_file(base_path)
        scen_dir = base_path.resolve().parent
        base_source = str(base_path)
    else:
        base_data, scen_dir, base_source = spec.base, base_dir.resolve(), f"{source}: base"
    if not isinstance(base_data, dict):
        raise SweepError(f"{base_source}: the top level must be a mapping")
    try:
        base_data = apply_overrides(copy.deepcopy(base_data), [*overrides_for(spec.set), *(extra_sets or [])])
    except ScenarioError as exc:
        raise SweepError(f"{source}: set: {exc}") from None
    policy_keys = _policy_axes(spec)
    items: list[tuple[dict[str, Any], Any, Any]] = []
    groups: list[str] = []
    wheres: list[tuple[str, dict[str, Any]]] = []
    for index, combo in enumerate(itertools.product(*(vals for _, vals in axes))):
        params: dict[str, Any] = {}
        for (keys, _), values in zip(axes, combo, strict=True):
            params.update(zip(keys, values, strict=True))
        where = f"{source}: point {index} ({_describe(params)})"
        try:
            data = apply_overrides(copy.deepcopy(base_data), overrides_for(params))
            loaded = load_scenario_data(copy.deepcopy(data), source=where, base_dir=scen_dir)
            load_plugins(loaded.plugin_paths(), where)   # the policy may be a plugin's
            pspec = loaded.scenario.policy_spec
            policy = make_policy(pspec.name, pspec.params)
            loaded.hardware_spec()
            if loaded.scenario.model is not None:
                loaded.model_spec(*_trace_model(loaded))
        except (ScenarioError, PolicyError) as exc:
            msg = str(exc)
            raise SweepError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        items.append((data, loaded, policy))
        groups.append(json.dumps({k: v for k, v in params.items() if k not in policy_keys}, sort_keys=True, default=str))
        wheres.append((where, params))
    points: list[Point] = []
    hashes: dict[str, int] = {}
    for index, ((_, _, policy), fit, (where, params)) in enumerate(
            zip(items, fit_points(items, groups), wheres, strict=True)):
        try:
            loaded = load_scenario_data(copy.deepcopy(fit.data), source=where, base_dir=scen_dir)
        except ScenarioError as exc:
            raise SweepError(f"{where}: {exc}") from None
        h = loaded.config_hash()
        if h in hashes:
            raise SweepError(f"{source}: points {hashes[h]} and {index} are the same scenario ({_describe(params)})")
        hashes[h] = index
        points.append(Point(index=index, params=params, data=fit.data, config_hash=h, source=where,
                            base_dir=scen_dir, bound=bool(policy.oracle), policy=policy.name, kind=fit.kind,
                            applied=fit.applied, unmet=fit.unmet))
    return Sweep(spec=spec, source=source, base_dir=scen_dir, points=points)


def _describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items()) or "base"


def parse_spec(data: Any, source: str) -> SweepSpec:
    """Validate the mapping of a sweep file; errors name the key, with a did-you-mean."""
    if not isinstance(data, dict):
        raise SweepError(f"{source}: the top level must be a mapping")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if not str(x).startswith(("list[", "dict[", "str"))]
        path = ".".join(loc) or "(top level)"
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1] if loc else "", list(SweepSpec.model_fields), n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else
                                   f"; known: {', '.join(SweepSpec.model_fields)}")
        raise SweepError(f"{source}: {path}: {msg}") from None


def load_sweep(path: str | Path, extra_sets: list[str] | None = None, seeds: int = 1) -> Sweep:
    """Read, validate and expand a sweep file; ``extra_sets`` (``KEY=VALUE``) apply to the base;
    ``seeds`` > 1 adds the axis ``seed: [0 .. seeds-1]`` (replicates, ``simctl sweep --seeds``)."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"{p}: no such sweep file")
    data = load_yaml_file(p)
    spec = parse_spec(data, str(p))
    if seeds < 1:
        raise SweepError(f"--seeds: {seeds} is not a count of seeds (give 1 or more)")
    if seeds > 1:
        if "seed" in spec.grid or any("seed" in g for g in spec.zip_groups()):
            raise SweepError(f"--seeds: {p} sweeps seed already; drop --seeds or the file's seed axis")
        spec.grid["seed"] = list(range(seeds))
    return expand(spec, source=str(p), base_dir=p.resolve().parent, extra_sets=extra_sets)
