"""Measurement files for ``simctl fit``: what was measured, on which setups, and what to fit.

A measurement file (YAML)::

    name: eliseev-mazur-2023-table2
    source: "Eliseev & Mazur, arXiv 2312.17238v1, Table 2"
    base: {trace: ..., model: ..., runtime: ..., workload: ...}   # scenario keys, or a scenario file
    fit:                                     # free values: dotted scenario keys with bounds
      runtime.layer_us: {min: 100, max: 50000}
      hardware.pcie_gbps: {min: 1, max: 64, per: hardware}   # one value per distinct hardware
    rows:
      - set: {hardware: a100-sxm-80gb, cache.experts_per_layer: 4, policy: lru}
        tokens_per_s: 2.918                  # any scalar metric of metrics.json (tpot_ms: its mean)
        role: fit                            # fit (default) or test: never seen by the fit
        source: "Table 2, row ..., column ..."
        read_off: false                      # optional: true where the value was read off a chart
        system: fiddler                      # optional: the published system, where the policy stands in for it
      - set: {policy: mixtral-offloading}
        relative_to: {policy: lru}           # a ratio row: metric(row) / metric(row with these keys)
        tpot_ms: 0.81
      - set: {policy: fmoe}
        relative_to: {policy: lru}
        mean_over: [{model: mixtral-8x7b}, {model: phi-3.5-moe}]   # a published mean over setups
        tpot_ms: 0.30                        # mean of the row's runs / mean of the references'

An empty ``fit: {}`` fits nothing: the rows are only predicted (a base with ``calibration:``
judged on published rows). ``notes:`` is free text.

:func:`load_measurements` validates it into :class:`Measurements`: every key checked against
the scenario schema, each row's scenario built (its ``set`` applied to ``base`` as ``--set``
does), the free values laid out (one per key, or one per group of a ``per:`` key), and the
refusals a fit needs before it runs (more free values than fit rows, a group with no fit row).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.yamlio import load_yaml_file

ROW_KEYS = ("set", "role", "source", "name", "read_off", "relative_to", "mean_over", "system")
"""The keys of a row that are not measurements."""


SYSTEM_HELP = ("the published system the row measured, where its policy only stands in for it: the policy name "
               "that stands for that system in simctl advise (fiddler), or the system's own name where moesim has "
               "no such policy (ktransformers); unset, the row's policy is its system")
"""What a measurement file's (or row's) ``system`` key means: what ``simctl advise``'s error
bands group published rows by (``benchmarks/advise_bands.py``)."""


def declared_systems(doc: dict[str, Any]) -> list[str | None]:
    """Each row's declared ``system`` in a measurement file's parsed YAML (``doc``): the row's
    own, else the file's, else None (the row's policy is its system; :data:`SYSTEM_HELP`)."""
    return [r.get("system", doc.get("system")) if isinstance(r, dict) else None for r in doc.get("rows") or []]


class FitError(MoesimError, ValueError):
    """A measurement file or a fit that cannot go on; the message names the file and the key."""


class FreeSpec(BaseModel):
    """Bounds of one fitted key (positive: the fit works on logarithms)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min: float = Field(gt=0, description="lower bound (positive)")
    max: float = Field(gt=0, description="upper bound")
    per: str | None = Field(None, description="a row key (e.g. hardware): one value per distinct value of it")
    start: float | None = Field(None, description="a start value, tried beside the coarse grid (inside the bounds)")

    @model_validator(mode="after")
    def _bounds(self) -> FreeSpec:
        if self.min >= self.max:
            raise ValueError(f"min {self.min:g} must be below max {self.max:g}")
        if self.start is not None and not self.min <= self.start <= self.max:
            raise ValueError(f"start {self.start:g} is outside the bounds [{self.min:g}, {self.max:g}]")
        return self


class RowSpec(BaseModel):
    """One measured setup: the scenario keys it sets, and what was measured (any other key)."""

    model_config = ConfigDict(extra="allow")

    set: dict[str, Any] = Field(default_factory=dict, description="dotted scenario keys of this setup, as --set")
    role: Literal["fit", "test"] = Field("fit", description="fit: the fit sees it; test: held out, only predicted")
    source: str | None = Field(None, description="where this row's numbers come from (table, row, column)")
    name: str | None = Field(None, description="a label for the row (default: its set)")
    read_off: bool = Field(False, description="true where the value was read off a chart, not printed")
    system: str | None = Field(None, min_length=1, description=SYSTEM_HELP + "; overrides the file's system")
    relative_to: dict[str, Any] | None = Field(
        None, description="a ratio row: dotted keys applied on top of this row's set give the reference; the "
        "measured value is the row's metric divided by the same metric of the reference run (same fitted values)")
    mean_over: list[dict[str, Any]] | None = Field(
        None, description="a published mean over several setups: each mapping (dotted keys, applied after the row's "
        "set) is one setup; the prediction is the mean of the metric over them (a ratio row: the mean of the row's "
        "runs over the mean of the references', the ratio of the means)")

    @model_validator(mode="after")
    def _measured(self) -> RowSpec:
        extra = self.model_extra or {}
        if not extra:
            raise ValueError("no measurement: give a metric of metrics.json with its measured value "
                             "(e.g. tokens_per_s: 2.9, tpot_ms: 340)")
        for key, value in extra.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{key}: {value!r} is not a measured value (a positive number); a row's other "
                                 f"keys are {', '.join(ROW_KEYS)}")
        return self

    def measured(self) -> dict[str, float]:
        """The measurements of the row: metric name -> measured value."""
        return {k: float(v) for k, v in (self.model_extra or {}).items()}


class MeasurementSpec(BaseModel):
    """The content of a measurement file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="name of the measurement set (shown wherever the fit is used)")
    source: str = Field(description="where the measurements come from")
    base: str | dict[str, Any] = Field(description="scenario keys every row starts from, or a scenario file")
    notes: str = Field("", description="free text: the setup as the source states it, the assumptions made")
    system: str | None = Field(None, min_length=1, description=SYSTEM_HELP + " (every row's, unless the row names "
                               "its own)")
    fit: dict[str, FreeSpec] = Field(description="dotted scenario key -> bounds (and per); empty: only predict the rows")
    rows: list[RowSpec] = Field(min_length=1, description="the measured setups")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("empty name")
        return v


@dataclass
class Row:
    """One row of the file with its scenario built (``data``: ``base`` with its ``set`` applied)."""

    index: int
    label: str
    role: str
    source: str
    set: dict[str, Any]
    measured: dict[str, float]
    data: dict[str, Any]
    groups: dict[str, str] = field(default_factory=dict)
    """For each ``per:`` key of the fit, this row's group."""
    relative_to: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] | None = None
    """A ratio row's reference scenario (``data`` with ``relative_to`` applied), else None."""
    read_off: bool = False
    mean_over: list[dict[str, Any]] = field(default_factory=list)
    """A mean row's setups (``mean_over``), else empty."""
    variants: list[tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    """A mean row's scenarios, one (row scenario, reference or None) per setup of ``mean_over``;
    ``data`` and ``reference`` are the first of them."""

    @property
    def where(self) -> str:
        """``rows[3] (hardware=t4, policy=lru)``: the row in messages."""
        return f"rows[{self.index}] ({self.label})"


@dataclass(frozen=True)
class FreeValue:
    """One value the fit chooses: a key for all rows (``per`` None) or for one group."""

    key: str
    lo: float
    hi: float
    per: str | None = None
    group: str | None = None
    start: float | None = None
    hi_source: str = ""
    """Where the upper bound comes from: empty for the declared one, else the physical limit
    that replaced it (:mod:`~moesim.sim.study.fit_bounds`)."""

    @property
    def label(self) -> str:
        """``hardware.pcie_gbps[hardware=t4]``."""
        return self.key if self.per is None else f"{self.key}[{self.per}={self.group}]"

    def applies_to(self, row: Row) -> bool:
        """Whether this value is used by ``row``."""
        return self.per is None or row.groups.get(self.per) == self.group


@dataclass
class Measurements:
    """A validated measurement file: its rows and the free values of the fit."""

    spec: MeasurementSpec
    path: Path
    base_dir: Path
    rows: list[Row]
    free: list[FreeValue]

    @property
    def source(self) -> str:
        """The file, as named on the command line."""
        return str(self.path)


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()) or "base"


def _format(exc: ValidationError, source: str) -> FitError:
    err = max(exc.errors(), key=lambda e: len(e.get("loc", ())))
    parts: list[str] = []
    for x in err.get("loc", ()):
        if isinstance(x, int):
            parts[-1:] = [f"{parts[-1]}[{x}]" if parts else f"[{x}]"]
        elif not str(x).startswith(("str", "dict[", "function-")):
            parts.append(str(x))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = f"unknown key (a measurement file has {', '.join(MeasurementSpec.model_fields)})"
    return FitError(f"{source}: {'.'.join(parts) or '(top level)'}: {msg}")


def _check_key(key: str, where: str) -> None:
    from moesim.sim.study.sweep import SweepError, check_key

    try:
        check_key(key, where)
    except SweepError as exc:
        raise FitError(str(exc)) from None
    if key.split(".")[0] in ("calibration", "name", "resolved"):
        raise FitError(f"{where}: {key}: not a key a row or a fit may set")


def _base(spec: MeasurementSpec, path: Path) -> tuple[dict[str, Any], Path]:
    if isinstance(spec.base, dict):
        return copy.deepcopy(spec.base), path.resolve().parent
    scen = Path(spec.base).expanduser()
    scen = scen if scen.is_absolute() else path.resolve().parent / scen
    if not scen.is_file():
        raise FitError(f"{path}: base: {spec.base}: no such scenario file")
    data = load_yaml_file(scen)
    if not isinstance(data, dict):
        raise FitError(f"{scen}: the top level must be a mapping")
    return data, scen.resolve().parent


def _rows(spec: MeasurementSpec, path: Path, base: dict[str, Any]) -> list[Row]:
    from moesim.sim.config.fitted import group_label
    from moesim.sim.config.scenario import ScenarioError, set_key

    rows: list[Row] = []
    for i, rs in enumerate(spec.rows):
        where = f"{path}: rows[{i}].set"
        data = copy.deepcopy(base)
        for key, value in rs.set.items():
            _check_key(key, where)
            if key in spec.fit:
                raise FitError(f"{where}: {key}: is fitted (under fit:); a row cannot also set it")
            try:
                set_key(data, key.split("."), value, f"{where}: {key}")
            except ScenarioError as exc:
                raise FitError(str(exc)) from None
        row = Row(index=i, label=rs.name or _describe(rs.set), role=rs.role, source=rs.source or "",
                  set=dict(rs.set), measured=rs.measured(), data=data, read_off=rs.read_off)
        if rs.relative_to is not None:
            where_ref = f"{path}: rows[{i}].relative_to"
            if not rs.relative_to:
                raise FitError(f"{where_ref}: empty: give the keys that turn this row into its reference")
            for key in rs.relative_to:
                _check_key(key, where_ref)
                if key in spec.fit:
                    raise FitError(f"{where_ref}: {key}: is fitted (under fit:); a reference cannot set it")
            row.relative_to = dict(rs.relative_to)
            row.reference = _apply(data, row.relative_to, where_ref)
            row.label += f" / {_describe(rs.relative_to)}"
        if rs.mean_over is not None:
            _mean_over(row, rs.mean_over, spec, f"{path}: rows[{i}].mean_over")
        for key, free in spec.fit.items():
            if free.per is None:
                continue
            found = {group_label(d, free.per) for d, _ in row.variants or [(row.data, None)]}
            labels = {x for x in found if x is not None}
            if not labels or len(labels) < len(found):
                raise FitError(f"{path}: {row.where}: gives no {free.per} (fit: {key} is per {free.per})")
            if len(labels) > 1:
                raise FitError(f"{path}: {row.where}: its mean_over setups differ in {free.per} "
                               f"({', '.join(sorted(labels))}), which fit: {key} is fitted per")
            row.groups[free.per] = labels.pop()
        rows.append(row)
    return rows


def _apply(data: dict[str, Any], keys: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of ``data`` with the dotted ``keys`` set, as ``--set`` does."""
    from moesim.sim.config.scenario import ScenarioError, set_key

    out = copy.deepcopy(data)
    for key, value in keys.items():
        try:
            set_key(out, key.split("."), value, f"{where}: {key}")
        except ScenarioError as exc:
            raise FitError(str(exc)) from None
    return out


def _mean_over(row: Row, setups: list[dict[str, Any]], spec: MeasurementSpec, where: str) -> None:
    """Lay out a mean row's setups: each applied after the row's ``set`` (and its reference's
    ``relative_to`` after that); a setup may not name a key the row, its reference or the fit sets."""
    if not setups:
        raise FitError(f"{where}: empty: give the setups the published value is a mean over")
    taken = {**row.set, **row.relative_to}
    for j, keys in enumerate(setups):
        at = f"{where}[{j}]"
        if not keys:
            raise FitError(f"{at}: empty: a setup needs at least one key")
        for key in keys:
            _check_key(key, at)
            if key in spec.fit:
                raise FitError(f"{at}: {key}: is fitted (under fit:); a setup cannot set it")
            if key in taken:
                raise FitError(f"{at}: {key}: is set by the row's set or relative_to already")
        data = _apply(row.data, keys, at)
        ref = None if row.reference is None else _apply(data, row.relative_to, f"{at} (relative_to)")
        row.variants.append((data, ref))
    row.mean_over = [dict(k) for k in setups]
    row.data, row.reference = row.variants[0]
    row.label += f" (mean over {len(setups)} setups)"


def _free_values(spec: MeasurementSpec, path: Path, rows: list[Row]) -> list[FreeValue]:
    free: list[FreeValue] = []
    fit_rows = [r for r in rows if r.role == "fit"]
    for key, fs in spec.fit.items():
        _check_key(key, f"{path}: fit")
        if fs.per is None:
            free.append(FreeValue(key, fs.min, fs.max, start=fs.start))
            continue
        _check_key(fs.per, f"{path}: fit.{key}.per")
        groups = list(dict.fromkeys(r.groups[fs.per] for r in rows))
        for g in groups:
            if not any(r.groups[fs.per] == g for r in fit_rows):
                test = next(r for r in rows if r.groups[fs.per] == g)
                raise FitError(f"{path}: fit.{key}: {fs.per} {g} has no fit row, so its value cannot be "
                               f"fitted ({test.where} is a test row)")
            free.append(FreeValue(key, fs.min, fs.max, per=fs.per, group=g, start=fs.start))
    free = [_physical(f, rows, path) for f in free]
    n_fit = sum(len(r.measured) for r in fit_rows)
    if len(free) > n_fit:
        names = ", ".join(f.label for f in free)
        raise FitError(f"{path}: {len(free)} free values ({names}) but only {n_fit} fit measurements; "
                       "fit fewer values or add fit rows")
    for group in value_groups(free, fit_rows):
        n = sum(len(r.measured) for r in fit_rows if any(free[j].applies_to(r) for j in group))
        if len(group) > n:
            names = ", ".join(free[j].label for j in group)
            raise FitError(f"{path}: {len(group)} free values ({names}) rest on {n} fit measurement"
                           f"{'s' if n != 1 else ''} only (no other row depends on them); add fit rows there")
    return free


def _physical(f: FreeValue, rows: list[Row], path: Path) -> FreeValue:
    """``f`` with its upper bound lowered to what physics allows over the rows it applies to
    (:func:`~moesim.sim.study.fit_bounds.physical_bound`); a declared range wholly beyond
    physics is an error."""
    import dataclasses

    from moesim.sim.study.fit_bounds import physical_bound

    found = physical_bound(f.key, [r for r in rows if f.applies_to(r)])
    if found is None or found[0] >= f.hi:
        return f
    hi, why = found
    if hi <= f.lo:
        raise FitError(f"{path}: fit.{f.key}: {f.label}'s range [{f.lo:g}, {f.hi:g}] lies beyond physics: at most "
                       f"{hi:.6g} ({why}); lower min")
    start = None if f.start is None else min(f.start, hi)
    return dataclasses.replace(f, hi=float(f"{hi:.10g}"), start=start, hi_source=why)


def value_groups(free: list[FreeValue], rows: list[Row]) -> list[list[int]]:
    """The free values (indices into ``free``) in independent groups: two values are in one
    group when a row of ``rows`` depends on both (a value for all rows joins everything). A
    group's values change only its own rows, so each group can be fitted on its own."""
    parent = list(range(len(free)))

    def root(j: int) -> int:
        while parent[j] != j:
            j = parent[j]
        return j

    for row in rows:
        js = [j for j, f in enumerate(free) if f.applies_to(row)]
        for j in js[1:]:
            parent[root(j)] = root(js[0])
    groups: dict[int, list[int]] = {}
    for j in range(len(free)):
        groups.setdefault(root(j), []).append(j)
    return list(groups.values())


def parse_measurements(data: Any, path: Path) -> Measurements:
    """Validate the parsed content of a measurement file (see the module)."""
    source = str(path)
    if not isinstance(data, dict):
        raise FitError(f"{source}: the top level must be a mapping")
    try:
        spec = MeasurementSpec.model_validate(data)
    except ValidationError as exc:
        raise _format(exc, source) from None
    base, base_dir = _base(spec, path)
    rows = _rows(spec, path, base)
    return Measurements(spec=spec, path=path, base_dir=base_dir, rows=rows, free=_free_values(spec, path, rows))


def load_measurements(path: str | Path) -> Measurements:
    """Read and validate a measurement file; every problem is one line naming the file."""
    p = Path(path)
    if not p.exists():
        raise FitError(f"{p}: no such measurement file")
    if p.is_dir():
        raise FitError(f"{p}: is a directory, not a measurement file")
    return parse_measurements(load_yaml_file(p), p)
