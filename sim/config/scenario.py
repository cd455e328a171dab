"""Scenario files: validated YAML describing one simulation run (docs/contract.md, "Scenario keys").

``load_scenario(path, overrides)`` reads the YAML, applies ``--set key=value`` overrides,
validates it (unknown keys, wrong types and out-of-range values are errors naming the YAML
path) and resolves catalog references. :func:`scenario_schema` gives the JSON Schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from moesim.sim.config.catalog import (
    CatalogError,
    CatalogFieldError,
    HardwareSpec,
    ModelSpec,
    RuntimeSpec,
    get_hardware,
    get_model,
    get_runtime,
    is_spec_file,
    load_spec_file,
    model_names,
)
from moesim.sim.config.keys import unknown_key_hint
from moesim.sim.config.overrides import apply_overrides, parse_override, set_key
from moesim.sim.config.scenario_error import ScenarioError
from moesim.sim.config.sections import CacheSpec, PcieSpec, PolicySpec, ProfileSpec, WorkloadSpec
from moesim.sim.config.serving_spec import SloSpec
from moesim.sim.core.errors import MoesimError
from moesim.sim.core.yamlio import load_yaml_file

ASSUMED_SIZES: dict[str, Any] = {"hidden_size": 4096, "expert_intermediate_size": 14336, "dtype_bytes": 2,
                                 "non_expert_bytes": 0}
"""The sizes a model outside the catalog gets when the scenario gives none (a trace knows the
routing shape, not the weights): Mixtral-8x7B's expert (352 MB in bf16) and no weights besides
the routed experts. The run's summary and ``metrics.json`` say so."""


class Scenario(BaseModel):
    """One simulation run."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("scenario", description="name shown in outputs")
    trace: str | dict[str, Any] = Field(description="trace file (relative to the scenario file) or {synthetic: {...}}")
    model: str | dict[str, Any] | None = Field(None, description="catalog name, {base: NAME, ...overrides} or a full spec; default: the trace's model")
    hardware: str | dict[str, Any] = Field(description="catalog name, {base: NAME, ...overrides}, a full spec, "
                                           "or a YAML file (*.yaml, relative to the scenario) such as a "
                                           "`simctl calibrate` profile")
    cache: CacheSpec = Field(description="expert budget")
    policy: str | PolicySpec = Field(description="policy name or {name, params}")
    plugins: list[str] = Field(default_factory=list, description="Python files (relative to the scenario "
                               "file) that register policies of your own with @register")
    pcie: PcieSpec = Field(default_factory=PcieSpec, description="copy-queue discipline")  # type: ignore[arg-type]
    runtime: str | dict[str, Any] = Field("none", description="framework overhead profile: catalog name "
                                          "(none, hf-eager, vllm-like, llama-cpp-like), {base: NAME, ...}, or a YAML "
                                          "file (*.yaml, relative to the scenario) such as a `simctl calibrate` profile")
    profile: ProfileSpec | None = Field(None, description="profiling split handed to policies at set-up, never measured")
    calibration: str | None = Field(
        None, description="a `simctl fit` file (fitted.yaml, relative to the scenario) whose fitted values this "
        "scenario takes: every value fitted for all rows, and each per-group value of the group matching this "
        "scenario (e.g. its hardware); `--set` items win over it, a different value in this file is an error")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="what to replay")  # type: ignore[arg-type]
    slo: SloSpec | None = Field(None, description="serving: latency targets ({ttft_ms, tpot_ms}) that goodput "
                                "counts requests against (with workload.arrivals)")
    seed: int = Field(0, ge=0, description="seed of every random choice of the run")
    resolved: dict[str, Any] | None = Field(
        None, exclude=True, description="written by `simctl run --out` into config.yaml: the model, hardware, "
        "policy and budget the run resolved to, for reading; ignored when the file is run again")

    @model_validator(mode="after")
    def _check_trace(self) -> Scenario:
        if isinstance(self.trace, dict):
            if set(self.trace) != {"synthetic"}:
                raise ValueError("trace must be a file path or a mapping with the single key 'synthetic'")
            if not isinstance(self.trace["synthetic"], dict):
                raise ValueError("trace.synthetic must be a mapping of generator parameters")
        return self

    @model_validator(mode="after")
    def _slo_with_arrivals(self) -> Scenario:
        if self.slo is not None and self.workload.arrivals is None:
            raise ValueError("slo goes with workload.arrivals: goodput counts served requests")
        return self

    @property
    def policy_spec(self) -> PolicySpec:
        return self.policy if isinstance(self.policy, PolicySpec) else PolicySpec(name=self.policy)


class LoadedScenario(BaseModel):
    """A validated scenario with its references resolved."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scenario: Scenario
    base_dir: Path
    source: str | None = None
    overrides: list[str] = []
    """The ``--set`` items applied on top of the file, in order (shown in the run summary)."""
    trace_fit: str | None = None
    """The ``simctl trace fit`` YAML that ``trace:`` named, now the synthetic mapping it holds."""
    calibration: dict[str, Any] | None = None
    """Provenance of the ``calibration:`` file and the values it applied (``None`` without one)."""

    def resolved(self) -> dict[str, Any]:
        """The scenario as plain data, for ``config.yaml``: every file it names (trace, profile
        trace, hardware/runtime profiles, plugins) as an absolute path, so that ``simctl run
        OUT/config.yaml`` runs the same scenario from anywhere."""
        data = self.scenario.model_dump(mode="json", exclude_none=True)
        trace = self.trace_path()
        if trace is not None:
            data["trace"] = str(trace.resolve())
        prof = self.profile_path()
        if prof is not None:
            data["profile"]["trace"] = str(prof.resolve())
        for key in ("hardware", "runtime"):
            spec = self.spec_file(key)
            if spec is not None:
                data[key] = str(spec.resolve())
        arrivals = self.scenario.workload.arrivals
        if arrivals is not None and arrivals.file is not None:
            data["workload"]["arrivals"]["file"] = str(self._file(arrivals.file).resolve())
        if data.get("plugins"):
            data["plugins"] = [str(p.resolve()) for p in self.plugin_paths()]
        if self.scenario.calibration is not None:
            data["calibration"] = str(self._file(self.scenario.calibration).resolve())
        return data

    def changes(self) -> list[str]:
        """Every change applied on top of a catalog entry or the file: the ``--set`` items and
        the inline overrides of ``model:``, ``hardware:`` and ``runtime:`` (``{base: NAME, ...}``)."""
        out = [f"--set {o}" for o in self.overrides]
        calibrated = set(self.calibration["values"]) if self.calibration else set()
        for key in ("model", "hardware", "runtime"):
            ref = getattr(self.scenario, key)
            if isinstance(ref, dict) and "base" in ref:
                out += [f"{key}.{k}={json.dumps(v)} (on {ref['base']})" for k, v in ref.items()
                        if k != "base" and f"{key}.{k}" not in calibrated]
        return out

    def fit_provenance(self) -> list[dict[str, Any]]:
        """Where fitted values of this run come from: the ``calibration:`` file, and any
        ``hardware:`` / ``runtime:`` file written by ``simctl fit`` (one entry each; empty when the
        run uses no fitted value). Shown in the run summary and ``metrics.json`` (``fit``)."""
        out = [self.calibration] if self.calibration else []
        files = [(key, self.spec_file(key)) for key in ("hardware", "runtime")]
        if any(path is not None for _, path in files):
            from moesim.sim.config.fitted import spec_file_provenance

            out += [prov for key, path in files if path is not None
                    for prov in [spec_file_provenance(path, key)] if prov is not None]
        return out

    def config_hash(self) -> str:
        """A key of the run: the resolved scenario plus the content of the files it names (trace,
        profile trace, hardware and runtime profiles, policy plugins), not their paths: a renamed
        file keeps its key and an edited one gets a new one."""
        data = self.resolved()
        files: dict[str, str] = {}
        trace = self.trace_path()
        if trace is not None:
            files["trace"] = file_digest(trace)
            del data["trace"]
        prof = self.profile_path()
        if prof is not None:
            files["profile"] = file_digest(prof)
            del data["profile"]["trace"]
        for key in ("hardware", "runtime"):
            spec = self.spec_file(key)
            if spec is not None:
                files[key] = file_digest(spec)
                del data[key]
        for i, plugin in enumerate(self.plugin_paths()):   # a policy's code decides its results
            files[f"plugin{i}"] = file_digest(plugin)
        if self.scenario.calibration is not None:
            files["calibration"] = file_digest(self._file(self.scenario.calibration))
            del data["calibration"]
        data.pop("plugins", None)
        blob = json.dumps({"scenario": data, "files": files}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def plugin_paths(self) -> list[Path]:
        """The scenario's plugin files, resolved against its folder."""
        return [self._file(item) for item in self.scenario.plugins]

    def profile_path(self) -> Path | None:
        """The profile split's own trace file, if it names one."""
        prof = self.scenario.profile
        return None if prof is None or prof.trace is None else self._file(prof.trace)

    def _file(self, item: str) -> Path:
        """A path from the scenario, relative to the scenario file's folder."""
        p = Path(item).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)

    def _catalog(self, key: str, resolve: Any, ref: Any) -> Any:
        """Resolve a catalog reference; errors are one line naming the scenario key."""
        src = self.source or "scenario"
        spec_file = self.spec_file(key) if key in ("hardware", "runtime") else None
        where = f"{key} ({spec_file})" if spec_file is not None else key
        try:
            return resolve(ref)
        except CatalogFieldError as exc:
            sep = " " if spec_file is not None else "."
            hint = ""
            if exc.suggestion:
                hint = f"; did you mean {exc.suggestion if spec_file is not None else f'{key}.{exc.suggestion}'!r}?"
            raise ScenarioError(f"{src}: {where}{sep}{exc.field}: {exc.problem}{hint}") from None
        except CatalogError as exc:
            raise ScenarioError(f"{src}: {where}: {exc}") from None
        except ValidationError as exc:
            raise ScenarioError(_format_validation(exc, self.source, prefix=key)) from None

    def spec_file(self, key: str) -> Path | None:
        """The file named by ``hardware:`` or ``runtime:`` (a string ending in .yaml/.yml,
        relative to the scenario), or None for a catalog reference."""
        ref = getattr(self.scenario, key)
        return self._file(ref) if is_spec_file(ref) else None

    def _ref(self, key: str) -> str | dict[str, Any]:
        path = self.spec_file(key)
        if path is None:
            ref: str | dict[str, Any] = getattr(self.scenario, key)
            return ref
        try:
            return load_spec_file(path, key)
        except CatalogError as exc:
            raise ScenarioError(f"{self.source or 'scenario'}: {key}: {exc}") from None

    def arrivals_path(self) -> Path | None:
        """The request log of ``workload.arrivals.file``, or None (no arrivals, or a rate)."""
        arrivals = self.scenario.workload.arrivals
        return None if arrivals is None or arrivals.file is None else self._file(arrivals.file)

    def trace_path(self) -> Path | None:
        """The trace file, or None for a synthetic trace."""
        t = self.scenario.trace
        return self._file(t) if isinstance(t, str) else None

    def missing_trace(self) -> str | None:
        """One line when the trace file does not exist (None when it does, or is synthetic): a
        relative path, written in the scenario or given as ``--set trace=``, is resolved
        against the scenario file's folder, and the line says which folder."""
        t = self.scenario.trace
        path = self.trace_path()
        if path is None or not isinstance(t, str) or path.exists():
            return None  # a folder or an unreadable file is the trace reader's to name
        return missing_file_line(self.source, "trace", t, path, self.base_dir)

    def model_spec(self, trace_model_name: str, trace_shape: dict[str, int] | None = None) -> ModelSpec:
        """The resolved model: the scenario's ``model:``, else the trace's own model by name.

        A trace's model outside the catalog (an imported capture) takes its shape from the trace
        (``trace_shape``: ``num_layers``, ``num_experts``, ``top_k``, ``num_shared_experts``) and
        its sizes from ``model: {hidden_size: ..., expert_intermediate_size: ...}`` (a mapping
        without a catalog ``base``; ``--set model.hidden_size=H`` makes one), each size not given
        from :data:`ASSUMED_SIZES`; :meth:`model_note` says which."""
        derived = self._derived_sizes(trace_model_name, trace_shape)
        if derived is not None and trace_shape is not None:
            ref: Any = {"name": trace_model_name, **trace_shape, **ASSUMED_SIZES, **derived}
        else:
            ref = self.scenario.model if self.scenario.model is not None else trace_model_name
        spec: ModelSpec = self._catalog("model", get_model, ref)
        return spec

    def _derived_sizes(self, trace_model_name: str, trace_shape: dict[str, int] | None) -> dict[str, Any] | None:
        """The sizes the scenario gives a model derived from the trace (see :meth:`model_spec`),
        or None when the model comes from the catalog or the scenario alone."""
        ref = self.scenario.model
        if trace_shape is None or trace_model_name in model_names():
            return None
        if ref is None or ref == trace_model_name:
            return {}
        if (isinstance(ref, dict) and "num_layers" not in ref
                and ref.get("base", trace_model_name) == trace_model_name):
            return {k: v for k, v in ref.items() if k != "base"}
        return None

    def model_note(self, trace_model_name: str, trace_shape: dict[str, int] | None) -> str | None:
        """What the run assumed about a model outside the catalog, as one sentence for the
        summary and ``metrics.json`` (None when nothing was assumed)."""
        given = self._derived_sizes(trace_model_name, trace_shape)
        if given is None or trace_shape is None:
            return None
        assumed = [k for k in ASSUMED_SIZES if k not in given]
        if not assumed:
            return None
        shape = (f"{trace_shape['num_layers']} MoE layers x {trace_shape['num_experts']} experts, "
                 f"top-{trace_shape['top_k']}")
        sizes = ", ".join(f"{k} {ASSUMED_SIZES[k]}" for k in assumed)
        return (f"model {trace_model_name!r} is not in the catalog: its shape ({shape}) comes from the trace and "
                f"these sizes are assumed: {sizes} (defaults: Mixtral-8x7B's expert, bf16, no other weights); give "
                f"the real ones as model: {{hidden_size: H, expert_intermediate_size: I, dtype_bytes: B, "
                f"non_expert_bytes: N}} (or --set model.hidden_size=H ...)")

    def hardware_spec(self) -> HardwareSpec:
        """The resolved hardware (a catalog name, a mapping or a YAML file such as a
        calibration profile)."""
        spec: HardwareSpec = self._catalog("hardware", get_hardware, self._ref("hardware"))
        return spec

    def runtime_spec(self) -> RuntimeSpec:
        """The resolved runtime-overhead profile (a catalog name, a mapping or a YAML file)."""
        spec: RuntimeSpec = self._catalog("runtime", get_runtime, self._ref("runtime"))
        return spec


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (remembered per path, size and modification time)."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _format_validation(exc: ValidationError, source: str | None, prefix: str = "",
                       root: type[BaseModel] | None = None) -> str:
    """One line naming the YAML path of the error that matters; an unknown key of ``root``
    (the document validated) gets a did-you-mean."""
    def clean(err: Any) -> list[str]:
        loc = [str(x) for x in err.get("loc", ()) if not str(x).startswith(("function-after", "union["))]
        # pydantic puts the union member's type name in the location; drop those
        return [x for x in loc if x not in ("str", "int", "dict[str,any]", "PolicySpec", "list[int]", "literal['all']")]

    # of a union's alternatives, the deepest error is the one about what the user meant
    # (policy: {params: {}} is a mapping without name, not a string)
    err = max(exc.errors(), key=lambda e: len(clean(e)))
    loc = clean(err)
    path = ".".join(([prefix] if prefix else []) + loc) or "(top level)"
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key" + (unknown_key_hint(root, loc) if root is not None else "")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{source or 'scenario'}: {path}: {msg}{more}"


def missing_file_line(source: str | None, key: str, ref: str, path: Path, base_dir: Path) -> str:
    """``KEY: REF: no such file``, saying for a relative ``REF`` the folder it was resolved
    against (the scenario file's, also for ``--set KEY=``) and the path that makes."""
    line = f"{source or 'scenario'}: {key}: {ref}: no such file"
    if not Path(ref).expanduser().is_absolute():
        line += (f" (a relative {key} path, in the scenario or in --set {key}=, is resolved against the scenario's "
                 f"folder {base_dir}: {path}; give an absolute path for a file elsewhere)")
    return line


def inline_trace_fit(data: dict[str, Any], *, source: str | None, base_dir: Path) -> str | None:
    """A ``trace:`` that names a YAML file (``simctl trace fit -o FIT.yaml``'s output, or any
    file holding ``{synthetic: {...}}``) is replaced in place by its mapping: the trace is then
    synthesised with those knobs. Returns the file's path as given (None when ``trace:`` is not
    such a file); a file that is no such mapping is one line naming it."""
    ref = data.get("trace")
    if not is_spec_file(ref):
        return None
    assert isinstance(ref, str)
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else base_dir / path
    where = f"{source or 'scenario'}: trace: {ref}"
    if not path.is_file():
        raise ScenarioError(missing_file_line(source, "trace", ref, path, base_dir))
    try:
        fit = load_yaml_file(path)
    except MoesimError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    if not isinstance(fit, dict) or not isinstance(fit.get("synthetic"), dict) or set(fit) != {"synthetic"}:
        raise ScenarioError(f"{where}: a YAML trace must hold {{synthetic: {{...}}}} (what `simctl trace fit -o` "
                            "writes); a recorded trace is a .parquet file")
    data["trace"] = {"synthetic": dict(fit["synthetic"])}
    return str(path)


def load_scenario_data(data: Any, *, source: str | None, base_dir: Path, overrides: list[str] | None = None,
                       fixed: Collection[str] = ()) -> LoadedScenario:
    """Override and validate a scenario given as plain data (``base_dir``: where its relative
    paths start). A ``trace:`` naming a ``simctl trace fit`` YAML becomes its synthetic mapping
    (:func:`inline_trace_fit`) before the overrides and after each one, so that
    ``--set trace=FIT.yaml --set trace.synthetic.requests=4`` works. A ``calibration:`` file
    (:mod:`moesim.sim.config.fitted`) applies its fitted values last, leaving alone the keys of
    ``overrides`` and the dotted keys ``fixed`` (values the caller has set)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(f"{source or 'scenario'}: the top level must be a mapping")
    fit = inline_trace_fit(data, source=source, base_dir=base_dir)
    for item in overrides or []:
        apply_overrides(data, [item])
        fit = inline_trace_fit(data, source=source, base_dir=base_dir) or (
            fit if isinstance(data.get("trace"), dict) else None)
    calibration = None
    if data.get("calibration") is not None:
        # the fitted-file models only when a scenario names one (a few ms of every run's start-up)
        from moesim.sim.config.fitted import CalibrationError, apply_calibration

        keep = {*fixed, *(".".join(parse_override(o)[0]) for o in overrides or [])}
        try:
            calibration = apply_calibration(data, base_dir=base_dir, source=source or "scenario", fixed=keep,
                                            set_key=set_key)
        except CalibrationError as exc:
            raise ScenarioError(str(exc)) from None
    try:
        scen = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(exc, source, root=Scenario)) from None
    return LoadedScenario(scenario=scen, base_dir=base_dir, source=source, overrides=list(overrides or []),
                          trace_fit=fit, calibration=calibration)


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> LoadedScenario:
    """Read, override and validate a scenario file."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"{p}: no such scenario file")
    if p.is_dir():
        raise ScenarioError(f"{p}: is a directory, not a scenario file")
    data = load_yaml_file(p)
    return load_scenario_data(data, source=str(p), base_dir=p.resolve().parent, overrides=overrides)


def scenario_schema() -> dict[str, Any]:
    """JSON Schema of scenario files."""
    return Scenario.model_json_schema()
