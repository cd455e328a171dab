"""Record-oriented importers: generic CSV and JSONL, and the FLAME-MoE-290M routing sample.

One record per (request, token, layer) with the fields of :data:`import_common.RECORD_FIELDS`
(``request_id, token_idx, layer, experts`` required; ``weights``, ``phase``, ``token_id``
optional). In CSV, ``experts`` and ``weights`` are space-separated strings; in JSONL, lists.
A column map (``--map experts=topk_ids,...``) renames the file's columns or keys to those
fields. Records may come in any order; they are sorted on import. Checked, each error naming
the file, the line and the field: integer fields (no floats, booleans or strings, magnitude
below 2**62, ids within 0..2**31-1), the width of every list (``top_k``), expert ids within
``0..E-1`` and distinct, weights finite and non-negative with the declared semantics, one
record per (request, token, layer), every token complete (all ``L`` layers; with
``drop_incomplete`` an incomplete token is dropped and its request's tokens renumbered
instead), token ids of a request ``0, 1, 2, ...`` without gaps and request ids one
contiguous range, phase constant within a token and no prefill after decode.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import DECODE, PHASES, PREFILL, ModelInfo, TraceMeta
from moesim.traces.importers.common import (
    INT_LIMIT,
    RECORD_FIELDS,
    REQUIRED_FIELDS,
    SourceError,
    model_info,
    sha256_file,
    source_file,
    text_lines,
    weight_kind,
)

FLAME_MODEL = "flame-moe-290m"
FLAME_FIRST_LAYER = 2  # upstream index of the first MoE layer (layer 1 is dense)
FLAME_MAP = {"expert_ids": "experts", "probs": "weights"}
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


_INT_RE = re.compile(r"[+-]?[0-9]+")


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
    names: dict[str, str] = field(default_factory=dict)  # field -> the file's column, for messages


def _bounded(value: int, path: Path, line: int, name: str) -> int:
    if abs(value) > INT_LIMIT:
        raise SourceError(path, f"integer {value} is too large for the column", line=line, field=name)
    return value


def _parse_int(text: Any, path: Path, line: int, name: str) -> int:
    if isinstance(text, bool):
        raise SourceError(path, f"expected an integer, got {text!r}", line=line, field=name)
    if isinstance(text, int):
        return _bounded(text, path, line, name)
    if isinstance(text, str):
        s = text.strip()
        if _INT_RE.fullmatch(s):
            return _bounded(int(s), path, line, name)
    shown = text if not isinstance(text, str) or len(text) <= 40 else text[:37] + "..."
    raise SourceError(path, f"expected an integer, got {shown!r}", line=line, field=name)


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
        raise SourceError(path, f"has {len(items)} entries, expected {width} (the model's top_k; --top-k sets another)", line=line, field=name)
    out: list[Any] = []
    for item in items:
        what = "an integer" if kind is int else "a number"
        if isinstance(item, bool) or not isinstance(item, (int, float, str)):
            raise SourceError(path, f"entry {item!r} is not {what}", line=line, field=name)
        if kind is int:
            if isinstance(item, float) or (isinstance(item, str) and not _INT_RE.fullmatch(item.strip())):
                raise SourceError(path, f"entry {item!r} is not {what}", line=line, field=name)
            out.append(_bounded(int(item), path, line, name))
        else:
            try:
                out.append(float(item))
            except (ValueError, OverflowError):
                raise SourceError(path, f"entry {item!r} is not {what}", line=line, field=name) from None
    return out


def _parse_phase(raw: Any, path: Path, line: int) -> int:
    if isinstance(raw, str) and raw.strip() in PHASES:
        return PHASES.index(raw.strip())
    raise SourceError(path, f"expected 'prefill' or 'decode', got {raw!r}", line=line, field="phase")


def _add_record(
    rec: _Records, values: Mapping[str, Any], path: Path, line: int, *, layer_offset: int = 0,
    names: Mapping[str, str], has_weights: bool, has_phase: bool, has_token_id: bool,
) -> None:
    """Parse one record; ``names`` maps each field to the column it came from (for messages)."""
    rec.lines.append(line)
    rec.request_id.append(_parse_int(values["request_id"], path, line, names["request_id"]))
    rec.token_idx.append(_parse_int(values["token_idx"], path, line, names["token_idx"]))
    rec.layer.append(_parse_int(values["layer"], path, line, names["layer"]) - layer_offset)
    rec.experts.append(_parse_list(values["experts"], path, line, names["experts"], rec.top_k, int))
    if has_weights:
        rec.weights.append(_parse_list(values["weights"], path, line, names["weights"], rec.top_k, float))
    rec.phase.append(_parse_phase(values["phase"], path, line) if has_phase else DECODE)
    if has_token_id:
        rec.token_id.append(_parse_int(values["token_id"], path, line, names["token_id"]))


def _check_header(names: Sequence[str], path: Path, line: int, rename: Mapping[str, str]) -> dict[str, str]:
    """Check the file's column names against the fields (after ``rename``: column -> field);
    returns ``{field: column}``. Unknown, duplicated and missing required columns are errors,
    and so is a mapped column that the file does not have."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SourceError(path, "column appears twice", line=line, field=name)
        seen.add(name)
    for column, fld in rename.items():
        if column not in seen:
            what = "missing required column" if fld in REQUIRED_FIELDS else "no such column"
            raise SourceError(path, f"{what} (read as field {fld!r})", line=line, field=column)
    allowed = [*rename, *(f for f in RECORD_FIELDS if f not in rename.values())]
    inverse = {v: k for k, v in rename.items()}
    fields: dict[str, str] = {}
    for name in names:
        if name in inverse and name not in rename:
            raise SourceError(path, f"column has the name of field {name!r}, as does column {inverse[name]!r} "
                                    "through the column map; keep one", line=line, field=name)
        if name not in allowed:
            raise SourceError(path, f"unknown column (expected some of {', '.join(allowed)}; "
                                    "--map FIELD=COLUMN renames)", line=line, field=name)
        fld = rename.get(name, name)
        if fld in fields:
            raise SourceError(path, f"column maps to field {fld!r}, as does column {fields[fld]!r}",
                              line=line, field=name)
        fields[fld] = name
    for fld in REQUIRED_FIELDS:
        if fld not in fields:
            raise SourceError(path, "missing required column", line=line, field=inverse.get(fld, fld))
    return fields


def _flags(fields: Mapping[str, str]) -> dict[str, bool]:
    return {"has_weights": "weights" in fields, "has_phase": "phase" in fields, "has_token_id": "token_id" in fields}


def read_csv_records(
    path: Path, model: ModelInfo, *, rename: Mapping[str, str] | None = None, layer_offset: int = 0,
) -> _Records:
    """Parse a CSV with a header line into records (``rename``: file column -> field)."""
    rename = dict(rename or {})
    rec = _Records(top_k=model.top_k)
    lines = text_lines(path)
    with contextlib.closing(lines):
        reader = csv.reader(text for _, text in lines)
        start = 1   # the line where the record being read begins: an unclosed quote is reported there
        try:
            header = next(reader, None)
            if header is None:
                raise SourceError(path, "empty file, expected a header line", line=1)
            header = [h.strip() for h in header]
            fields = _check_header(header, path, reader.line_num, rename)
            rec.names = fields
            names: list[str] = [rename.get(h, h) for h in header]
            while True:
                start = reader.line_num + 1
                row = next(reader, None)
                if row is None:
                    break
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) != len(names) and line > start:   # a quoted field took the next lines in
                    raise SourceError(path, f"has {len(row)} fields, the header has {len(names)}: a quote opened on "
                                            f"this line runs on to line {line}; is it closed?", line=start)
                if len(row) != len(names):
                    raise SourceError(path, f"has {len(row)} fields, the header has {len(names)}", line=line)
                _add_record(rec, dict(zip(names, row, strict=True)), path, start,   # where the record begins
                            layer_offset=layer_offset, names=fields, **_flags(fields))
        except csv.Error as exc:
            if reader.line_num > start:   # the record ran on past its line: a quote opened there never closes
                raise SourceError(path, f"malformed CSV: a quoted field opened on this line is not closed ({exc})",
                                  line=start) from None
            raise SourceError(path, f"malformed CSV ({exc})", line=reader.line_num) from None
    return rec


def read_jsonl_records(path: Path, model: ModelInfo, *, rename: Mapping[str, str] | None = None) -> _Records:
    """Parse JSON lines, one object per record (``rename``: file key -> field)."""
    rename = dict(rename or {})
    rec = _Records(top_k=model.top_k)
    first: dict[str, bool] | None = None
    for line, text in text_lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            what = f"{exc.msg}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "nested too deep"
            raise SourceError(path, f"invalid JSON ({what})", line=line) from None
        if not isinstance(obj, dict):
            raise SourceError(path, "expected a JSON object", line=line)
        fields = _check_header(list(obj), path, line, rename)
        present = _flags(fields)
        if first is None:
            first = present
            rec.names = fields
        for key, flag in present.items():
            if flag != first[key]:
                name = key.removeprefix("has_")
                what = "present here but absent" if flag else "absent here but present"
                raise SourceError(path, f"{what} in the first record", line=line, field=fields.get(name, name))
        values: dict[str, Any] = {rename.get(str(k), str(k)): v for k, v in obj.items()}
        _add_record(rec, values, path, line, names=fields, **present)
    return rec


def assemble_records(
    rec: _Records, model: ModelInfo, path: Path, *, layer_field_offset: int = 0,
    drop_incomplete: bool = False, weights: str = "auto",
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Check the records (ranges, duplicates, gaps, completeness, phases, weights) naming
    the offending line, and return the columns sorted by (request_id, token_idx, layer) and
    the facts for ``source`` (``weights`` kind, ``dropped_tokens``)."""
    n = len(rec.lines)
    if n == 0:
        raise SourceError(path, "no records")
    lines = np.asarray(rec.lines, dtype=np.int64)
    req = np.asarray(rec.request_id, dtype=np.int64)
    tok = np.asarray(rec.token_idx, dtype=np.int64)
    lay = np.asarray(rec.layer, dtype=np.int64)
    experts = np.asarray(rec.experts, dtype=np.int64).reshape(n, model.top_k)
    phase = np.asarray(rec.phase, dtype=np.int8)
    facts: dict[str, Any] = {}

    def col(name: str) -> str:
        return rec.names.get(name, name)

    def fail(mask: Any, msg: Any, name: str) -> None:
        mask = np.asarray(mask)
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise SourceError(path, msg(i) if callable(msg) else msg, line=int(lines[i]), field=col(name))

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
    w = None
    if rec.weights:
        w = np.asarray(rec.weights, dtype=np.float64).reshape(n, model.top_k)
        fail(~np.isfinite(w).all(axis=1), "non-finite value", "weights")
        facts["weights"] = weight_kind(w, weights, path, lines, field=col("weights"))
    token_id = None
    if rec.token_id:
        token_id = np.asarray(rec.token_id, dtype=np.int64)
        fail((token_id < 0) | (token_id > i32), "must be in 0..2**31-1", "token_id")

    order = np.lexsort((lay, tok, req))  # stable: ties keep file order
    req, tok, lay, lines, phase, experts = req[order], tok[order], lay[order], lines[order], phase[order], experts[order]
    if w is not None:
        w = w[order]
    if token_id is not None:
        token_id = token_id[order]

    def fail_sorted(mask: np.ndarray, msg: Any, name: str) -> None:
        if mask.any():
            idx = np.flatnonzero(mask)
            i = int(idx[np.argmin(lines[idx])])  # the offence found earliest in the file
            raise SourceError(path, msg(i) if callable(msg) else msg, line=int(lines[i]), field=col(name))

    same_key = np.zeros(n, dtype=bool)
    same_key[1:] = (req[1:] == req[:-1]) & (tok[1:] == tok[:-1]) & (lay[1:] == lay[:-1])
    fail_sorted(same_key, lambda i: f"second record for request {req[i]}, token {tok[i]}, "
                                    f"layer {lay[i] + layer_field_offset} (first at line {lines[i - 1]})",
                "layer")
    # gaps: request ids one contiguous range, token ids of a request 0, 1, 2, ...
    new_req = np.ones(n, dtype=bool)
    new_req[1:] = req[1:] != req[:-1]
    req_jump = new_req.copy()
    req_jump[0] = False
    req_jump[1:] &= req[1:] != req[:-1] + 1
    fail_sorted(req_jump, lambda i: f"request ids jump from {req[i - 1]} to {req[i]} "
                                    f"(request {req[i - 1] + 1} missing)", "request_id")
    new_tok = np.ones(n, dtype=bool)
    new_tok[1:] = (req[1:] != req[:-1]) | (tok[1:] != tok[:-1])
    fail_sorted(new_req & (tok != 0), lambda i: f"request {req[i]} starts at token {tok[i]}, not 0", "token_idx")
    tok_jump = new_tok & ~new_req
    tok_jump[1:] &= tok[1:] != tok[:-1] + 1
    tok_jump[0] = False
    fail_sorted(tok_jump, lambda i: f"request {req[i]} jumps from token {tok[i - 1]} to {tok[i]} "
                                    f"(token {tok[i - 1] + 1} missing)", "token_idx")

    starts = np.flatnonzero(new_tok)
    sizes = np.diff(np.append(starts, n))
    short_tok = sizes != model.num_layers
    if drop_incomplete and short_tok.any():
        keep_tok = ~short_tok
        if not keep_tok.any():
            raise SourceError(path, f"every token misses layers (none has all {model.num_layers}); nothing left")
        keep = np.repeat(keep_tok, sizes)
        facts["dropped_tokens"] = int(short_tok.sum())
        req, tok, lay, lines, phase, experts = req[keep], tok[keep], lay[keep], lines[keep], phase[keep], experts[keep]
        w = w[keep] if w is not None else None
        token_id = token_id[keep] if token_id is not None else None
        n = len(req)
        # renumber the kept tokens of each request 0, 1, 2, ...
        new_tok = np.ones(n, dtype=bool)
        new_tok[1:] = (req[1:] != req[:-1]) | (tok[1:] != tok[:-1])
        tok_no = np.cumsum(new_tok) - 1
        first_of_req = np.ones(n, dtype=bool)
        first_of_req[1:] = req[1:] != req[:-1]
        tok = tok_no - np.maximum.accumulate(np.where(first_of_req, tok_no, 0))
        starts = np.flatnonzero(new_tok)
        sizes = np.diff(np.append(starts, n))
        short_tok = sizes != model.num_layers
    elif drop_incomplete:
        facts["dropped_tokens"] = 0
    short = np.zeros(n, dtype=bool)
    short[starts[short_tok]] = True

    def missing(i: int) -> str:
        j = int(np.searchsorted(starts, i, side="right") - 1)
        have = set(lay[starts[j]: starts[j] + sizes[j]].tolist())
        gone = [str(x + layer_field_offset) for x in range(model.num_layers) if x not in have]
        return (f"request {req[i]}, token {tok[i]} has {sizes[j]} of {model.num_layers} layers "
                f"(missing {' '.join(gone)}); --drop-incomplete drops such tokens")

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
    if w is not None:
        cols["weights"] = w.astype(np.float32)
    if token_id is not None:
        cols["token_id"] = token_id.astype(np.int32)
    return cols, facts


def import_flame(
    src: str | os.PathLike[str], *, model: ModelInfo | None = None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Convert the FLAME-MoE-290M routing sample (``routing.csv``, see its NOTICE).

    Upstream layers 2..9 become MoE layers 0..7; every row is a decode step. ``model``
    defaults to the catalog entry ``flame-moe-290m``. The result depends on the CSV bytes
    only, so the converted file is reproducible. Its ``probs`` are the softmax over all 64
    experts at the chosen six (the sample's NOTICE); the shipped sample's metadata predates
    the ``weights`` key, so this importer does not add it (the sample stays byte-identical)."""
    path = source_file(src)
    info = model or model_info(FLAME_MODEL)
    rec = read_csv_records(path, info, rename=FLAME_MAP, layer_offset=FLAME_FIRST_LAYER)
    cols, _ = assemble_records(rec, info, path, layer_field_offset=FLAME_FIRST_LAYER)
    source = {**FLAME_SOURCE, "file": path.name, "sha256": sha256_file(path)}
    return cols, TraceMeta(model=info, source=source)


def _import_generic(
    fmt: str, src: str | os.PathLike[str], model: ModelInfo, column_map: Mapping[str, str] | None,
    drop_incomplete: bool, weights: str,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    path = source_file(src)
    rename = dict(column_map or {})
    rec = read_csv_records(path, model, rename=rename) if fmt == "csv" else read_jsonl_records(path, model, rename=rename)
    if weights != "auto" and not rec.weights:
        raise MoesimError(f"{path}: --weights {weights} given, but the file has no weights column")
    cols, facts = assemble_records(rec, model, path, drop_incomplete=drop_incomplete, weights=weights)
    source: dict[str, Any] = {"importer": fmt, "file": path.name, "sha256": sha256_file(path)}
    if rename:
        source["map"] = {fld: col for col, fld in rename.items()}
    source.update(facts)
    return cols, TraceMeta(model=model, source=source)


def import_csv(
    src: str | os.PathLike[str], *, model: ModelInfo, column_map: Mapping[str, str] | None = None,
    drop_incomplete: bool = False, weights: str = "auto",
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import a generic CSV: header ``request_id,token_idx,layer,experts[,weights][,phase]
    [,token_id]`` (or other names through ``column_map``, file column -> field),
    ``experts``/``weights`` space-separated, ``phase`` defaulting to decode. ``weights``
    (``auto`` or one of :data:`import_common.WEIGHT_KINDS`) is what the weights mean,
    recorded as ``source["weights"]``."""
    return _import_generic("csv", src, model, column_map, drop_incomplete, weights)


def import_jsonl(
    src: str | os.PathLike[str], *, model: ModelInfo, column_map: Mapping[str, str] | None = None,
    drop_incomplete: bool = False, weights: str = "auto",
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import JSON lines, one object per record with the keys of :func:`import_csv`
    (``experts`` and ``weights`` as JSON lists)."""
    return _import_generic("jsonl", src, model, column_map, drop_incomplete, weights)
