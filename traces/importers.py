"""Importers that turn router logs of other tools into moe-trace v1 files.

Each importer returns ``(columns, meta)`` ready for :func:`traces.format.write_trace`;
:func:`import_trace` picks one by name and writes the file. Sources:

``flame``
    The FLAME-MoE-290M routing sample (``routing.csv`` of ``../shared/data/flame-moe-290m``):
    upstream MoE layers 2..9 become layers 0..7, ``expert_ids``/``probs`` become
    ``experts``/``weights``, ``token_id`` is kept, and every row is a decode step (the sample
    is teacher-forced, which equals generation routing for a causal model).
``csv`` / ``jsonl``
    One record per (request, token, layer) with ``request_id, token_idx, layer, experts``
    and optional ``weights``, ``phase`` (``prefill``/``decode``, default ``decode``) and
    ``token_id``. In CSV, ``experts`` and ``weights`` are space-separated strings; in JSONL,
    lists. Records may come in any order; they are sorted on import.
``vllm``
    vLLM's routed-experts capture (``--enable-return-routed-experts``): an integer array
    ``[tokens, layers, top_k]`` saved with :func:`numpy.save`, the tokens of all requests one
    after the other, plus the request boundaries from a JSON sidecar
    ``{"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]}`` or a list of ``P:D``
    pairs. The first ``P`` tokens of a request are prefill, the next ``D`` decode.

Every malformed input raises :class:`SourceError`, whose one-line message names the file,
the line (or array index) and the field.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.catalog import CatalogError, get_model, model_names
from moesim.sim.errors import MoesimError
from moesim.traces.format import (
    DECODE,
    PHASES,
    PREFILL,
    ModelInfo,
    TraceError,
    TraceMeta,
    write_trace,
)

FORMATS = ("flame", "csv", "jsonl", "vllm")

FLAME_MODEL = "flame-moe-290m"
FLAME_FIRST_LAYER = 2  # upstream index of the first MoE layer (layer 1 is dense)
FLAME_SOURCE: dict[str, Any] = {
    "importer": "flame",
    "dataset": "FLAME-MoE-Traces (CMU)",
    "license": "Apache-2.0",
    "checkpoint": 5473,
    "run": 31066,
    "sampled_from": "github.com/Akash-N-Pai/DynaNDE-Simulator, "
                    "'Sample routing traces/Encoder_Batch_0-32/'",
    "layers": "upstream MoE layers 2..9 renumbered 0..7",
    "phase": "teacher-forced over pretraining text; every row replayed as decode",
    "notice": "NOTICE.md beside the converted file",
}

_GENERIC_FIELDS = ("request_id", "token_idx", "layer", "experts", "weights", "phase", "token_id")
_REQUIRED_FIELDS = ("request_id", "token_idx", "layer", "experts")


class SourceError(TraceError):
    """Malformed importer input. ``str(err)`` is one line: ``FILE, line N, field 'x': what``
    (``line`` may be another locator such as ``token 12, layer 3`` for array inputs)."""

    def __init__(
        self, path: str | os.PathLike[str] | None, message: str, *,
        line: int | None = None, field: str | None = None, where: str | None = None,
    ) -> None:
        parts = [str(path) if path is not None else "<input>"]
        if line is not None:
            parts.append(f"line {line}")
        if where is not None:
            parts.append(where)
        if field is not None:
            parts.append(f"field {field!r}")
        Exception.__init__(self, ": ".join([", ".join(parts), message]))
        self.path, self.row, self.column = path, line, field


# --------------------------------------------------------------------------------------------
# Model shape and output


def model_info(
    name: str, *, num_layers: int | None = None, num_experts: int | None = None,
    top_k: int | None = None, num_shared_experts: int | None = None,
) -> ModelInfo:
    """The routed-expert shape of a trace: a catalog entry, with any of the shape fields
    overridden; a name outside the catalog needs all of ``num_layers``, ``num_experts`` and
    ``top_k``. Raises :class:`sim.catalog.CatalogError` (one line) otherwise."""
    given = {"num_layers": num_layers, "num_experts": num_experts, "top_k": top_k}
    if name in model_names():
        spec = get_model(name)
        base = {"num_layers": spec.num_layers, "num_experts": spec.num_experts,
                "top_k": spec.top_k, "num_shared_experts": spec.num_shared_experts}
    elif all(v is not None for v in given.values()):
        base = {"num_shared_experts": 0}
    else:
        try:
            get_model(name)  # raises with a did-you-mean
        except CatalogError as exc:
            raise CatalogError(f"{exc}; or give --num-layers, --num-experts and --top-k") from None
        raise CatalogError(f"unknown model {name!r}")  # pragma: no cover
    for key, val in {**given, "num_shared_experts": num_shared_experts}.items():
        if val is not None:
            base[key] = int(val)
    try:
        return ModelInfo(name=name, **base)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None


def save_trace(path: str | os.PathLike[str], columns: Mapping[str, Any], meta: TraceMeta) -> Path:
    """:func:`traces.format.write_trace` with OS errors (unwritable folder, a directory in the
    way) turned into a one-line :class:`TraceError`. Nothing is left at ``path`` on error."""
    try:
        return write_trace(path, columns, meta)
    except OSError as exc:
        raise TraceError(path, f"cannot write the trace ({exc.strerror or exc})") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _source_file(src: str | os.PathLike[str]) -> Path:
    p = Path(src)
    if not p.exists():
        raise SourceError(src, "no such file")
    if p.is_dir():
        raise SourceError(src, "is a directory, not a file")
    return p


# --------------------------------------------------------------------------------------------
# Record-oriented sources (CSV, JSONL, FLAME)


@dataclass
class _Records:
    """Parsed records in file order; ``lines`` holds each record's line number (1-based)."""

    top_k: int
    lines: list[int] = field(default_factory=list)
    request_id: list[int] = field(default_factory=list)
    token_idx: list[int] = field(default_factory=list)
    layer: list[int] = field(default_factory=list)
    experts: list[list[int]] = field(default_factory=list)
    weights: list[list[float]] = field(default_factory=list)
    phase: list[int] = field(default_factory=list)
    token_id: list[int] = field(default_factory=list)


def _parse_int(text: Any, path: Path, line: int, name: str) -> int:
    if isinstance(text, bool):
        raise SourceError(path, f"expected an integer, got {text!r}", line=line, field=name)
    if isinstance(text, int):
        return text
    if isinstance(text, str):
        try:
            return int(text.strip())
        except ValueError:
            pass
    raise SourceError(path, f"expected an integer, got {text!r}", line=line, field=name)


def _parse_list(raw: Any, path: Path, line: int, name: str, width: int, kind: type) -> list[Any]:
    """A list of ``width`` ints or floats from a space-separated string or a JSON list."""
    items: list[Any]
    if isinstance(raw, str):
        items = raw.split()
    elif isinstance(raw, list):
        items = raw
    else:
        raise SourceError(path, f"expected a list, got {raw!r}", line=line, field=name)
    if len(items) != width:
        raise SourceError(path, f"has {len(items)} entries, expected {width} (top_k)", line=line, field=name)
    out: list[Any] = []
    for item in items:
        if isinstance(item, bool):
            item = repr(item)  # rejected below
        try:
            if kind is int:
                if isinstance(item, float) or (isinstance(item, str) and not item.strip().lstrip("+-").isdigit()):
                    raise ValueError
                out.append(int(item))
            else:
                out.append(float(item))
        except (TypeError, ValueError):
            what = "an integer" if kind is int else "a number"
            raise SourceError(path, f"entry {item!r} is not {what}", line=line, field=name) from None
    return out


def _parse_phase(raw: Any, path: Path, line: int) -> int:
    if isinstance(raw, str) and raw.strip() in PHASES:
        return PHASES.index(raw.strip())
    raise SourceError(path, f"expected 'prefill' or 'decode', got {raw!r}", line=line, field="phase")


def _add_record(
    rec: _Records, values: Mapping[str, Any], path: Path, line: int, *, layer_offset: int = 0,
    has_weights: bool, has_phase: bool, has_token_id: bool,
) -> None:
    rec.lines.append(line)
    rec.request_id.append(_parse_int(values["request_id"], path, line, "request_id"))
    rec.token_idx.append(_parse_int(values["token_idx"], path, line, "token_idx"))
    rec.layer.append(_parse_int(values["layer"], path, line, "layer") - layer_offset)
    rec.experts.append(_parse_list(values["experts"], path, line, "experts", rec.top_k, int))
    if has_weights:
        rec.weights.append(_parse_list(values["weights"], path, line, "weights", rec.top_k, float))
    rec.phase.append(_parse_phase(values["phase"], path, line) if has_phase else DECODE)
    if has_token_id:
        rec.token_id.append(_parse_int(values["token_id"], path, line, "token_id"))


def _check_header(names: Sequence[str], path: Path, line: int, allowed: Sequence[str]) -> None:
    for name in names:
        if name not in allowed:
            raise SourceError(path, f"unknown column (expected some of {', '.join(allowed)})",
                              line=line, field=name)
    for name in allowed:
        if name in _REQUIRED_FIELDS and name not in names:
            raise SourceError(path, "missing required column", line=line, field=name)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SourceError(path, "column appears twice", line=line, field=name)
        seen.add(name)


def _read_csv(
    path: Path, model: ModelInfo, *, rename: Mapping[str, str] | None = None, layer_offset: int = 0,
) -> _Records:
    rename = dict(rename or {})
    allowed = [k for k, v in rename.items()] + [f for f in _GENERIC_FIELDS if f not in rename.values()]
    rec = _Records(top_k=model.top_k)
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SourceError(path, f"cannot read ({exc.strerror})") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise SourceError(path, "empty file, expected a header line", line=1)
            header = [h.strip() for h in header]
            _check_header(header, path, reader.line_num, allowed)
            names = [rename.get(h, h) for h in header]
            flags = {"has_weights": "weights" in names, "has_phase": "phase" in names,
                     "has_token_id": "token_id" in names}
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) != len(names):
                    raise SourceError(path, f"has {len(row)} fields, the header has {len(names)}", line=line)
                _add_record(rec, dict(zip(names, row, strict=True)), path, line,
                            layer_offset=layer_offset, **flags)
        except csv.Error as exc:
            raise SourceError(path, f"malformed CSV ({exc})", line=reader.line_num) from None
        except UnicodeDecodeError:
            raise SourceError(path, "not UTF-8 text", line=reader.line_num + 1) from None
    return rec


def _read_jsonl(path: Path, model: ModelInfo) -> _Records:
    rec = _Records(top_k=model.top_k)
    flags: dict[str, bool] | None = None
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise SourceError(path, f"cannot read ({exc.strerror})") from None
    with fh:
        line = 0
        try:
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise SourceError(path, f"invalid JSON ({exc.msg}, column {exc.colno})", line=line) from None
                if not isinstance(obj, dict):
                    raise SourceError(path, "expected a JSON object", line=line)
                _check_header(list(obj), path, line, _GENERIC_FIELDS)
                present = {"has_weights": "weights" in obj, "has_phase": "phase" in obj,
                           "has_token_id": "token_id" in obj}
                if flags is None:
                    flags = present
                for key, flag in present.items():
                    if flag != flags[key]:
                        name = key.removeprefix("has_")
                        what = "present here but absent" if flag else "absent here but present"
                        raise SourceError(path, f"{what} in the first record", line=line, field=name)
                _add_record(rec, obj, path, line, **flags)
        except UnicodeDecodeError:
            raise SourceError(path, "not UTF-8 text", line=line + 1) from None
    return rec


def _assemble(rec: _Records, model: ModelInfo, path: Path, *, layer_field_offset: int = 0) -> dict[str, np.ndarray]:
    """Check the records (ranges, duplicates, completeness, phases) naming the offending line,
    and return the columns sorted by (request_id, token_idx, layer)."""
    n = len(rec.lines)
    if n == 0:
        raise SourceError(path, "no records")
    lines = np.asarray(rec.lines, dtype=np.int64)
    req = np.asarray(rec.request_id, dtype=np.int64)
    tok = np.asarray(rec.token_idx, dtype=np.int64)
    lay = np.asarray(rec.layer, dtype=np.int64)
    experts = np.asarray(rec.experts, dtype=np.int64).reshape(n, model.top_k)
    phase = np.asarray(rec.phase, dtype=np.int8)

    def fail(mask: Any, msg: Any, name: str) -> None:
        mask = np.asarray(mask)
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise SourceError(path, msg(i) if callable(msg) else msg, line=int(lines[i]), field=name)

    i32 = np.iinfo(np.int32).max
    fail((req < 0) | (req > i32), "must be in 0..2**31-1", "request_id")
    fail((tok < 0) | (tok > i32), "must be in 0..2**31-1", "token_idx")
    fail((lay < 0) | (lay >= model.num_layers),
         lambda i: f"layer {lay[i] + layer_field_offset} outside "
                   f"{layer_field_offset}..{model.num_layers - 1 + layer_field_offset}", "layer")
    fail(((experts < 0) | (experts >= model.num_experts)).any(axis=1),
         f"expert id outside 0..{model.num_experts - 1}", "experts")
    if model.top_k > 1:
        srt = np.sort(experts, axis=1)
        fail((srt[:, 1:] == srt[:, :-1]).any(axis=1), "duplicated expert in one record", "experts")
    weights = None
    if rec.weights:
        weights = np.asarray(rec.weights, dtype=np.float64).reshape(n, model.top_k)
        fail(~np.isfinite(weights).all(axis=1), "non-finite value", "weights")
    token_id = None
    if rec.token_id:
        token_id = np.asarray(rec.token_id, dtype=np.int64)
        fail((token_id < 0) | (token_id > i32), "must be in 0..2**31-1", "token_id")

    order = np.lexsort((lay, tok, req))  # stable: ties keep file order
    req, tok, lay, lines, phase = req[order], tok[order], lay[order], lines[order], phase[order]
    experts = experts[order]

    def fail_sorted(mask: np.ndarray, msg: Any, name: str) -> None:
        if mask.any():
            idx = np.flatnonzero(mask)
            i = int(idx[np.argmin(lines[idx])])  # the offence found earliest in the file
            raise SourceError(path, msg(i) if callable(msg) else msg, line=int(lines[i]), field=name)

    same_key = np.zeros(n, dtype=bool)
    same_key[1:] = (req[1:] == req[:-1]) & (tok[1:] == tok[:-1]) & (lay[1:] == lay[:-1])
    fail_sorted(same_key, lambda i: f"second record for request {req[i]}, token {tok[i]}, "
                                    f"layer {lay[i] + layer_field_offset} (first at line {lines[i - 1]})",
                "layer")
    new_tok = np.ones(n, dtype=bool)
    new_tok[1:] = (req[1:] != req[:-1]) | (tok[1:] != tok[:-1])
    starts = np.flatnonzero(new_tok)
    sizes = np.diff(np.append(starts, n))
    short = np.zeros(n, dtype=bool)
    short[starts[sizes != model.num_layers]] = True

    def missing(i: int) -> str:
        j = int(np.searchsorted(starts, i, side="right") - 1)
        have = set(lay[starts[j]: starts[j] + sizes[j]].tolist())
        gone = [str(x + layer_field_offset) for x in range(model.num_layers) if x not in have]
        return (f"request {req[i]}, token {tok[i]} has {sizes[j]} of {model.num_layers} layers "
                f"(missing {' '.join(gone)})")

    fail_sorted(short, missing, "layer")
    tok_of_row = np.cumsum(new_tok) - 1
    fail_sorted(phase != phase[starts][tok_of_row], "phase differs between layers of one token", "phase")
    prev_decode = np.zeros(n, dtype=bool)
    prev_decode[1:] = (req[1:] == req[:-1]) & (phase[:-1] == DECODE) & (phase[1:] == PREFILL)
    fail_sorted(prev_decode, "prefill token after a decode token of the same request", "phase")

    cols: dict[str, np.ndarray] = {
        "request_id": req.astype(np.int32), "token_idx": tok.astype(np.int32), "phase": phase,
        "layer": lay.astype(np.int16), "experts": experts.astype(np.int16),
    }
    if weights is not None:
        cols["weights"] = weights[order].astype(np.float32)
    if token_id is not None:
        cols["token_id"] = token_id[order].astype(np.int32)
    return cols


def import_flame(
    src: str | os.PathLike[str], *, model: ModelInfo | None = None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Convert the FLAME-MoE-290M routing sample (``routing.csv``, see its NOTICE).

    Upstream layers 2..9 become MoE layers 0..7; every row is a decode step. ``model``
    defaults to the catalog entry ``flame-moe-290m``. The result depends on the CSV bytes
    only, so the converted file is reproducible.
    """
    path = _source_file(src)
    info = model or model_info(FLAME_MODEL)
    rec = _read_csv(path, info, rename={"expert_ids": "experts", "probs": "weights"},
                    layer_offset=FLAME_FIRST_LAYER)
    cols = _assemble(rec, info, path, layer_field_offset=FLAME_FIRST_LAYER)
    source = {**FLAME_SOURCE, "file": path.name, "sha256": _sha256(path)}
    return cols, TraceMeta(model=info, source=source)


def import_csv(src: str | os.PathLike[str], *, model: ModelInfo) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import a generic CSV: header ``request_id,token_idx,layer,experts[,weights][,phase]
    [,token_id]``, ``experts``/``weights`` space-separated, ``phase`` defaulting to decode."""
    path = _source_file(src)
    cols = _assemble(_read_csv(path, model), model, path)
    return cols, TraceMeta(model=model, source={"importer": "csv", "file": path.name, "sha256": _sha256(path)})


def import_jsonl(src: str | os.PathLike[str], *, model: ModelInfo) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import JSON lines, one object per record with the keys of :func:`import_csv`
    (``experts`` and ``weights`` as JSON lists)."""
    path = _source_file(src)
    cols = _assemble(_read_jsonl(path, model), model, path)
    return cols, TraceMeta(model=model, source={"importer": "jsonl", "file": path.name, "sha256": _sha256(path)})


# --------------------------------------------------------------------------------------------
# vLLM routed-experts capture


def parse_request_lengths(text: str) -> list[tuple[int, int]]:
    """Parse ``"P:D,P:D,..."`` (prompt and decode tokens per request) into pairs."""
    out: list[tuple[int, int]] = []
    for i, item in enumerate(text.split(",")):
        parts = item.strip().split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            p, d = int(parts[0]), int(parts[1])
            if p < 0 or d < 0 or p + d == 0:
                raise ValueError
        except ValueError:
            raise MoesimError(f"--request-lengths: item {i} {item.strip()!r} is not PROMPT:DECODE "
                              "with non-negative counts, not both zero") from None
        out.append((p, d))
    return out


def read_sidecar(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """Read ``{"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]}``."""
    p = _source_file(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SourceError(p, f"invalid JSON ({exc.msg})", line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(p, f"cannot read ({exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("requests"), list):
        raise SourceError(p, 'expected {"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]}',
                          field="requests")
    unknown = sorted(set(obj) - {"requests", "model", "note"})
    if unknown:
        raise SourceError(p, "unknown key", field=unknown[0])
    out: list[tuple[int, int]] = []
    for i, req in enumerate(obj["requests"]):
        if not isinstance(req, dict):
            raise SourceError(p, "expected an object", field=f"requests[{i}]")
        extra = sorted(set(req) - {"prompt_tokens", "output_tokens"})
        if extra:
            raise SourceError(p, "unknown key", field=f"requests[{i}].{extra[0]}")
        vals = []
        for key in ("prompt_tokens", "output_tokens"):
            v = req.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SourceError(p, f"expected a non-negative integer, got {v!r}", field=f"requests[{i}].{key}")
            vals.append(v)
        if vals[0] + vals[1] == 0:
            raise SourceError(p, "a request needs at least one token", field=f"requests[{i}]")
        out.append((vals[0], vals[1]))
    if not out:
        raise SourceError(p, "no requests", field="requests")
    return out


def import_vllm(
    src: str | os.PathLike[str], *, model: ModelInfo,
    sidecar: str | os.PathLike[str] | None = None,
    request_lengths: Sequence[tuple[int, int]] | None = None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import a vLLM routed-experts capture: an integer ``.npy`` array ``[tokens, layers,
    top_k]`` holding the tokens of all requests in order, and per request ``(prompt, decode)``
    token counts from ``request_lengths``, from ``sidecar``, or from ``SRC`` with suffix
    ``.json`` when that file exists. Counts must add up to the array's tokens (a capture that
    never feeds the last sampled token holds ``D - 1`` decode rows for ``D`` outputs).
    No weights or logits are captured by vLLM, so the trace has ``experts`` only."""
    path = _source_file(src)
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
    except (ValueError, OSError, EOFError) as exc:
        raise SourceError(path, f"not a numpy .npy array ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    if not isinstance(arr, np.ndarray):
        raise SourceError(path, "expected a single .npy array, not an .npz archive")
    if arr.ndim != 3:
        raise SourceError(path, f"array has shape {tuple(arr.shape)}, expected [tokens, layers, top_k]")
    if arr.dtype.kind not in "iu":
        raise SourceError(path, f"array has dtype {arr.dtype}, expected integers (int16)")
    tokens, layers, k = (int(x) for x in arr.shape)
    if layers != model.num_layers:
        raise SourceError(path, f"array has {layers} layers, model {model.name!r} has {model.num_layers}")
    if k != model.top_k:
        raise SourceError(path, f"array has top_k {k}, model {model.name!r} has {model.top_k}")
    side_path: Path | None = None
    if request_lengths is None:
        if sidecar is None and path.with_suffix(".json").exists():
            sidecar = path.with_suffix(".json")
        if sidecar is None:
            raise MoesimError(f"{path}: no request boundaries; give --sidecar FILE.json or "
                              "--request-lengths P:D,...")
        side_path = Path(sidecar)
        request_lengths = read_sidecar(side_path)
    lengths = np.asarray(request_lengths, dtype=np.int64).reshape(-1, 2)
    total = int(lengths.sum())
    if total != tokens:
        where = side_path if side_path is not None else "--request-lengths"
        raise MoesimError(f"{where}: the requests hold {total} tokens, the array {path.name} has {tokens}")

    experts = np.asarray(arr, dtype=np.int64)
    bad = (experts < 0) | (experts >= model.num_experts)
    if bad.any():
        t, lay, _ = (int(x) for x in np.argwhere(bad)[0])
        raise SourceError(path, f"expert id {experts[t, lay][bad[t, lay]][0]} outside 0..{model.num_experts - 1}",
                          where=f"token {t}, layer {lay}", field="experts")
    if k > 1:
        srt = np.sort(experts, axis=2)
        dup = (srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2)
        if dup.any():
            t, lay = (int(x) for x in np.argwhere(dup)[0])
            raise SourceError(path, "duplicated expert", where=f"token {t}, layer {lay}", field="experts")

    per_req = lengths.sum(axis=1)
    req_of_tok = np.repeat(np.arange(len(lengths), dtype=np.int64), per_req)
    starts = np.concatenate([[0], np.cumsum(per_req)[:-1]])
    pos = np.arange(tokens, dtype=np.int64) - starts[req_of_tok]
    phase_tok = np.where(pos < lengths[req_of_tok, 0], PREFILL, DECODE).astype(np.int8)
    cols: dict[str, np.ndarray] = {
        "request_id": np.repeat(req_of_tok, layers).astype(np.int32),
        "token_idx": np.repeat(pos, layers).astype(np.int32),
        "phase": np.repeat(phase_tok, layers),
        "layer": np.tile(np.arange(layers, dtype=np.int16), tokens),
        "experts": experts.reshape(tokens * layers, k).astype(np.int16),
    }
    source: dict[str, Any] = {"importer": "vllm", "file": path.name, "sha256": _sha256(path),
                              "requests": len(lengths)}
    if side_path is not None:
        source["sidecar"] = side_path.name
    return cols, TraceMeta(model=model, source=source)


# --------------------------------------------------------------------------------------------


def import_trace(
    fmt: str, src: str | os.PathLike[str], out: str | os.PathLike[str], *,
    model: ModelInfo | None = None,
    sidecar: str | os.PathLike[str] | None = None,
    request_lengths: Sequence[tuple[int, int]] | None = None,
) -> tuple[Path, TraceMeta, int]:
    """Import ``src`` in format ``fmt`` (one of :data:`FORMATS`) and write ``out`` atomically.
    Returns ``(out, meta, rows)``. ``model`` is required except for ``flame``."""
    if fmt not in FORMATS:
        raise MoesimError(f"unknown import format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "flame":
        cols, meta = import_flame(src, model=model)
    else:
        if model is None:
            raise MoesimError(f"--model is required for --from {fmt}")
        if fmt == "csv":
            cols, meta = import_csv(src, model=model)
        elif fmt == "jsonl":
            cols, meta = import_jsonl(src, model=model)
        else:
            cols, meta = import_vllm(src, model=model, sidecar=sidecar, request_lengths=request_lengths)
    path = save_trace(out, cols, meta)
    return path, meta, int(len(cols["request_id"]))
