"""Reading a ``simctl fit`` file (``fitted.yaml``) where a scenario uses it.

A fitted file holds ``fit:`` (its provenance: name, source, rows, errors), ``parameters:`` (each
fitted value with its key, group, bounds) and, when every row ran on one hardware or runtime,
``hardware:`` / ``runtime:`` sections. A scenario takes it three ways:

* ``calibration: fitted.yaml`` applies every fitted value: those fitted for all rows, and of a
  per-group value (``per: hardware``) the one of the group matching the scenario; a scenario
  without the section of a fitted key (no ``runtime:``) takes the fit's (``context:``);
* ``hardware: fitted.yaml`` / ``runtime: fitted.yaml`` read its section like a calibration profile.

Either way the run's summary and ``metrics.json`` (``fit``) carry the provenance
(:func:`apply_calibration`, :func:`spec_file_provenance`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moesim.sim.core.errors import MoesimError


class FittedFileError(MoesimError, ValueError):
    """A fitted file that cannot be used; the message names it."""


class ErrorSummary(BaseModel):
    """How far predictions are from measurements over a set of rows."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=0, description="measurements summarised")
    median_abs_error_pct: float | None = Field(description="median of |predicted / measured - 1|, in %")
    max_ratio: float | None = Field(description="largest max(predicted / measured, measured / predicted)")
    within_1_5x: int = Field(ge=0, description="measurements predicted within a factor 1.5")

    def line(self) -> str:
        """``8 rows: median |error| 4.1%, max ratio 1.12x, 8 within 1.5x``."""
        if not self.rows or self.median_abs_error_pct is None or self.max_ratio is None:
            return "no rows"
        return (f"{self.rows} rows: median |error| {self.median_abs_error_pct:.1f}%, max ratio "
                f"{self.max_ratio:.2f}x, {self.within_1_5x} of {self.rows} within 1.5x")


class FitProvenance(BaseModel):
    """The ``fit:`` section: what was fitted to what, and how well it predicts."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str
    measurements: str = Field(description="the measurement file: relative to the folder the fit ran in when below it, else absolute")
    measurements_sha256: str = ""
    fit_rows: int = Field(ge=0, description="measurements the fit saw")
    test_rows: int = Field(ge=0, description="measurements held out (role: test), never seen by the fit")
    fit_error: ErrorSummary
    leave_one_out: ErrorSummary | None = None
    leave_one_out_method: str = ""
    held_out: ErrorSummary | None = None
    optimizer: dict[str, Any] = Field(default_factory=dict)
    at_bound: list[str] = Field(default_factory=list, description="fitted values pressed against a bound "
                                "(``label at max``): not measurements; each parameter names the missing cost")
    command: str = ""
    date: str = ""
    moesim: str = ""


class FittedParameter(BaseModel):
    """One fitted value: a dotted scenario key, for all rows or for one group of them."""

    model_config = ConfigDict(extra="forbid")

    key: str
    value: float
    per: str | None = Field(None, description="the row key whose values form the groups (None: one value for all)")
    group: str | None = Field(None, description="the value of `per` this fitted value is for")
    min: float
    max: float
    start: float | None = None
    at_bound: Literal["min", "max"] | None = None
    bound_source: str = Field("", description="where max comes from when physics set it (the link's "
                              "theoretical rate, the measured step); empty: the measurement file's bound")
    missing_cost: str | None = Field(None, description="for a value at a bound: the cost the measurements seem "
                                     "to ask for (a value at a bound is not a measurement)")
    rel_std: float | None = Field(None, description="approximate relative standard error, from the Jacobian")
    source: str = Field("", description="the fit this value comes from (name, source, rows, held-out error)")
    fit_rows: list[str] = Field(default_factory=list, description="the fit rows this value depends on")
    held_out: ErrorSummary | None = Field(None, description="error over the held-out rows this value applies to")


class FittedFile(BaseModel):
    """A whole ``fitted.yaml``."""

    model_config = ConfigDict(extra="forbid")

    fit: FitProvenance
    parameters: list[FittedParameter] = Field(description="the fitted values (empty for a set that fits nothing)")
    rows: list[dict[str, Any]] = Field(default_factory=list)
    context: dict[str, Any] = Field(
        default_factory=dict, description="for a fitted key's section (runtime, model...): the value every row "
        "of the fit had, which a scenario without that section takes with the fitted value")
    hardware: dict[str, Any] | None = None
    runtime: dict[str, Any] | None = None


def is_fit_data(data: Any) -> bool:
    """A parsed YAML mapping that is a ``simctl fit`` file."""
    return isinstance(data, dict) and isinstance(data.get("fit"), dict) and "parameters" in data


_CACHE: dict[tuple[str, int, int], FittedFile] = {}


def read_fitted(path: Path) -> FittedFile:
    """Read and validate a fitted file (remembered per path, size and modification time)."""
    from moesim.sim.core.yamlio import load_yaml_file

    p = Path(path)
    if not p.is_file():
        raise FittedFileError(f"{p}: no such fitted file (write one with `simctl fit MEASUREMENTS.yaml --out DIR`)")
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        data = load_yaml_file(p)
        if not is_fit_data(data):
            raise FittedFileError(f"{p}: not a `simctl fit` file (no fit: and parameters: sections); "
                                  "a `simctl calibrate` profile goes under hardware: and runtime:")
        try:
            _CACHE[key] = FittedFile.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
            msg = "unknown key" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid value")
            raise FittedFileError(f"{p}: {loc}: {msg}") from None
    return _CACHE[key]


def lookup(data: dict[str, Any], key: str) -> Any:
    """The value at a dotted key of a raw scenario mapping, or None where the path stops."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def group_label(data: dict[str, Any], per: str) -> str | None:
    """The group of a raw scenario for a ``per:`` key: a catalog name as written (``hardware:
    rtx-4090`` and ``hardware: {base: rtx-4090, ...}`` are both ``rtx-4090``), a policy's name,
    or the value as JSON; None when the scenario does not give it."""
    value = lookup(data, per)
    if isinstance(value, dict):
        value = value.get("base", value.get("name", value))
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def summary_line(fit: FitProvenance) -> str:
    """The provenance in one line: name, source, rows, held-out error."""
    held = (f"held-out {fit.held_out.line()}" if fit.held_out is not None and fit.held_out.rows
            else "no held-out rows")
    bound = f"; AT A BOUND (a cost is missing): {', '.join(fit.at_bound)}" if fit.at_bound else ""
    return f"fit {fit.name} ({fit.source}): {fit.fit_rows} fit rows; {held}{bound}"


def _provenance(path: Path, ff: FittedFile, via: str, values: dict[str, float],
                group: dict[str, str]) -> dict[str, Any]:
    fit = ff.fit
    return {"via": via, "file": str(path.resolve()), "name": fit.name, "source": fit.source,
            "group": group, "values": values, "fit_rows": fit.fit_rows, "test_rows": fit.test_rows,
            "fit_error": fit.fit_error.model_dump(),
            "held_out": None if fit.held_out is None else fit.held_out.model_dump(),
            "summary": summary_line(fit)}


class CalibrationError(MoesimError, ValueError):
    """A ``calibration:`` file that a scenario cannot take (one line naming it)."""


def apply_calibration(data: dict[str, Any], *, base_dir: Path, source: str, fixed: set[str],
                      set_key: Callable[[dict[str, Any], list[str], Any, str], None]) -> dict[str, Any]:
    """Apply the fitted values of ``data['calibration']`` to the raw scenario ``data`` (in place,
    each through ``set_key``, the scenario's own dotted-key setter) and return their provenance.
    Keys in ``fixed`` (``--set`` items, a fit's own values) are left alone; a scenario that writes
    a calibrated key with another value is an error."""
    ref = data["calibration"]
    if not isinstance(ref, str):
        raise CalibrationError(f"{source}: calibration: expected the path of a `simctl fit` file, got {type(ref).__name__}")
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else base_dir / path
    try:
        ff = read_fitted(path)
    except MoesimError as exc:
        raise CalibrationError(f"{source}: calibration: {exc}") from None
    chosen: dict[str, float] = {}
    group: dict[str, str] = {}
    for key in dict.fromkeys(p.key for p in ff.parameters):
        params = [p for p in ff.parameters if p.key == key]
        per = params[0].per
        if per is None:
            chosen[key] = params[0].value
            continue
        label = group_label(data, per)
        match = [p for p in params if p.group == label]
        if not match:
            groups = ", ".join(str(p.group) for p in params)
            mine = "gives none" if label is None else f"has {per} {label}"
            raise CalibrationError(f"{source}: calibration: {path} fits {key} per {per} for {groups}; "
                                f"this scenario {mine}")
        chosen[key] = match[0].value
        group[per] = label or ""
    applied: dict[str, float] = {}
    context: dict[str, Any] = {}
    for key, value in chosen.items():
        if key in fixed:
            continue
        top = key.split(".")[0]
        if data.get(top) is None and top in ff.context:   # e.g. no runtime: the fit's runtime
            data[top] = copy.deepcopy(ff.context[top])
            context[top] = ff.context[top]
        given = lookup(data, key)
        if given is not None and not (isinstance(given, (int, float)) and float(given) == value):
            raise CalibrationError(f"{source}: {key}: the scenario gives {given!r} and calibration {path} "
                                f"fitted {value!r}; drop one (or override it with --set)")
        set_key(data, key.split("."), value, f"calibration {path}: {key}")
        applied[key] = value
    prov = _provenance(path, ff, "calibration", applied, group)
    prov["held_out_of_values"] = {  # each applied value's own held-out rows (its group's)
        p.key: p.held_out.model_dump() for p in ff.parameters
        if p.key in applied and p.held_out is not None and (p.per is None or p.group == group.get(p.per))}
    if context:
        prov["context"] = context
    return prov


def spec_file_provenance(path: Path, section: str) -> dict[str, Any] | None:
    """The provenance of a ``hardware:`` or ``runtime:`` file that ``simctl fit`` wrote (None
    for any other file, such as a ``simctl calibrate`` profile)."""
    from moesim.sim.core.yamlio import load_yaml_file

    try:
        data = load_yaml_file(path)
    except MoesimError:
        return None
    if not is_fit_data(data):
        return None
    ff = read_fitted(path)
    values = {p.key: p.value for p in ff.parameters if p.key.startswith(f"{section}.")}
    return _provenance(path, ff, section, values, {})


def print_fit_file(path: str | Path, console: Any) -> bool:
    """For ``simctl hardware FILE``: print a fitted file's provenance and values; False when the
    file is not a fitted file (nothing printed)."""
    from rich.table import Table

    from moesim.sim.core.yamlio import load_yaml_file

    if not is_fit_data(load_yaml_file(path)):
        return False
    ff = read_fitted(Path(path))
    t = Table("key", "group", "value", "bounds", "rel. std", "its held-out rows", title=summary_line(ff.fit))
    for p in ff.parameters:
        grp = "all rows" if p.per is None else f"{p.per}={p.group}"
        bound = f"[{p.min:g}, {p.max:g}]" + (f" at {p.at_bound}" if p.at_bound else "")
        std = "-" if p.rel_std is None else f"{p.rel_std:.1%}"
        held = p.held_out.line() if p.held_out is not None else "-"
        t.add_row(p.key, grp, f"{p.value:.6g}", bound, std, held)
    console.print(t)
    for p in ff.parameters:
        if p.at_bound:
            grp = "" if p.per is None else f"[{p.per}={p.group}]"
            console.print(f"{p.key}{grp} is AT its {p.at_bound} bound (not a measurement); missing cost: "
                          f"{p.missing_cost or 'not named'}", markup=False, highlight=False)
        if p.bound_source:
            console.print(f"{p.key} max {p.max:g}: {p.bound_source}", markup=False, highlight=False)
    fit = ff.fit
    console.print(f"measurements: {fit.measurements}")
    console.print(f"fit error: {fit.fit_error.line()}")
    if fit.leave_one_out is not None:
        console.print(f"leave-one-out ({fit.leave_one_out_method}): {fit.leave_one_out.line()}")
    console.print(f"held-out: {fit.held_out.line() if fit.held_out is not None else 'no rows'}")
    return True
