"""Importers for the routing captures that inference engines emit (no hand reshaping).

``vllm`` (``.npy``)
    An integer array ``[tokens, layers, top_k]`` saved with :func:`numpy.save`, the tokens of
    all requests one after the other, with the request boundaries from a JSON sidecar
    ``{"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]}`` or ``P:D`` pairs.
``vllm`` (``.json`` / ``.jsonl``)
    vLLM's responses with ``--enable-return-routed-experts`` (docs.vllm.ai, "Routed Experts
    Replay"): each response object holds ``prompt_routed_experts`` ``[prompt_len, layers,
    top_k]`` and, per completion choice, ``routed_experts`` ``[gen_len, layers, top_k]``
    (nested JSON lists; ``routed_experts`` may also sit at the top level, as an offline
    ``RequestOutput`` dumped to JSON). One response per line (or a JSON list of them); every
    choice becomes one request: the prompt rows (prefill), then its generated rows (decode).
``sglang``
    SGLang's responses with ``--enable-return-routed-experts`` and ``return_routed_experts``
    (its native ``/generate``: ``meta_info.routed_experts``; the OpenAI endpoints:
    ``choices[i].sgl_ext.routed_experts``): base64 of int32 expert ids, flattened
    ``[tokens, layers, top_k]``, covering the sequence ``[0, seqlen - 1)`` (the last sampled
    token is never run), with ``prompt_tokens`` / ``completion_tokens`` from ``meta_info`` or
    ``usage`` giving the prefill/decode split. One response per line (or a JSON list).
``llamacpp``
    The ``layer,expert`` CSV of llama.cpp's ``moe-trace`` example (ggml-org/llama.cpp pull
    request 28544): one row per routed activation, written from the ``ffn_moe_topk-<layer>``
    id tensor of each MoE layer of each micro-batch in evaluation order, so a micro-batch is
    ``layers`` runs of ``tokens * top_k`` rows (token-major, the ggml layout of an
    ``[top_k, tokens]`` tensor). The layer numbers are the model's block indices; the ``L``
    distinct ones are renumbered ``0..L-1``. One capture is one prompt plus its greedy
    continuation: the leading micro-batches of more than one token (or the first, if it holds
    one) are the prompt, every later token decode; ``request_lengths`` overrides the split.

Every malformed input raises :class:`SourceError` naming the file, the line, response or
array index, and the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import DECODE, PREFILL, ModelInfo, TraceMeta
from moesim.traces.importers.common import (
    INT_LIMIT,
    SourceError,
    decode_utf8,
    sha256_file,
    source_file,
    text_lines,
)

# --------------------------------------------------------------------------------------------
# Shared: token-major expert arrays to moe-trace columns


def _check_experts(experts: np.ndarray, model: ModelInfo, path: Path, locate: Any) -> None:
    """Range and duplicate checks of ``[tokens, layers, k]`` ids; ``locate(token, layer)``
    names the place of the first offence (a string)."""
    bad = (experts < 0) | (experts >= model.num_experts)
    if bad.any():
        t, lay, j = (int(x) for x in np.argwhere(bad)[0])
        raise SourceError(path, f"expert id {experts[t, lay, j]} outside 0..{model.num_experts - 1}",
                          where=locate(t, lay), field="experts")
    if experts.shape[2] > 1:
        srt = np.sort(experts, axis=2)
        dup = (srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2)
        if dup.any():
            t, lay = (int(x) for x in np.argwhere(dup)[0])
            raise SourceError(path, "duplicated expert", where=locate(t, lay), field="experts")


def _columns(experts: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of a trace from ``experts`` ``[tokens, layers, k]`` (all requests in order)
    and ``lengths`` ``[requests, 2]`` (prefill, decode tokens of each)."""
    tokens, layers, k = experts.shape
    per_req = lengths.sum(axis=1)
    req_of_tok = np.repeat(np.arange(len(lengths), dtype=np.int64), per_req)
    starts = np.concatenate([[0], np.cumsum(per_req)[:-1]]).astype(np.int64)
    pos = np.arange(tokens, dtype=np.int64) - starts[req_of_tok]
    phase_tok = np.where(pos < lengths[req_of_tok, 0], PREFILL, DECODE).astype(np.int8)
    return {
        "request_id": np.repeat(req_of_tok, layers).astype(np.int32),
        "token_idx": np.repeat(pos, layers).astype(np.int32),
        "phase": np.repeat(phase_tok, layers),
        "layer": np.tile(np.arange(layers, dtype=np.int16), tokens),
        "experts": experts.reshape(tokens * layers, k).astype(np.int16),
    }


def _split(lengths: Sequence[tuple[int, int]], tokens: int, where: Any, what: str) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    total = int(arr.sum())
    if total != tokens:
        raise MoesimError(f"{where}: the requests hold {total} tokens, {what} has {tokens}")
    return arr


# --------------------------------------------------------------------------------------------
# vLLM: .npy array + request boundaries


def read_sidecar(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """Read ``{"requests": [{"prompt_tokens": P, "output_tokens": D}, ...]}``."""
    p = source_file(path)
    try:
        obj = json.loads(decode_utf8(p, p.read_bytes()))
    except json.JSONDecodeError as exc:
        raise SourceError(p, f"invalid JSON ({exc.msg})", line=exc.lineno) from None
    except (OSError, RecursionError) as exc:
        raise SourceError(p, f"cannot read ({type(exc).__name__})") from None
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
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > INT_LIMIT:
                raise SourceError(p, f"expected a non-negative integer, got {v!r}", field=f"requests[{i}].{key}")
            vals.append(v)
        if vals[0] + vals[1] == 0:
            raise SourceError(p, "a request needs at least one token", field=f"requests[{i}]")
        out.append((vals[0], vals[1]))
    if not out:
        raise SourceError(p, "no requests", field="requests")
    return out


def _import_vllm_npy(
    path: Path, model: ModelInfo, sidecar: str | os.PathLike[str] | None,
    request_lengths: Sequence[tuple[int, int]] | None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
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
    where = side_path if side_path is not None else "--request-lengths"
    lengths = _split(request_lengths, tokens, where, f"the array {path.name}")
    experts = np.asarray(arr, dtype=np.int64)
    _check_experts(experts, model, path, lambda t, lay: f"token {t}, layer {lay}")
    source: dict[str, Any] = {"importer": "vllm", "file": path.name, "sha256": sha256_file(path),
                              "requests": len(lengths)}
    if side_path is not None:
        source["sidecar"] = side_path.name
    return _columns(experts, lengths), TraceMeta(model=model, source=source)


# --------------------------------------------------------------------------------------------
# Response files (vLLM, SGLang): JSON lines, or one JSON value


def _responses(path: Path) -> list[tuple[int, Any]]:
    """The response objects of a JSON or JSON-lines file, each with its line number."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(path, f"cannot read ({exc.strerror})") from None
    text = decode_utf8(path, data)
    out: list[tuple[int, Any]] = []
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        whole = None
    if whole is not None:
        items = whole if isinstance(whole, list) else [whole]
        out = [(1, obj) for obj in items]
    else:
        for line, row in enumerate(text.splitlines(), start=1):
            if not row.strip():
                continue
            try:
                obj = json.loads(row)
            except json.JSONDecodeError as exc:
                raise SourceError(path, f"invalid JSON ({exc.msg}, column {exc.colno})", line=line) from None
            except RecursionError:
                raise SourceError(path, "invalid JSON (nested too deep)", line=line) from None
            out.extend((line, o) for o in (obj if isinstance(obj, list) else [obj]))
    if not out:
        raise SourceError(path, "no responses")
    for line, obj in out:
        if not isinstance(obj, dict):
            raise SourceError(path, f"expected a response object, got {type(obj).__name__}", line=line)
    return out


def _id_array(raw: Any, model: ModelInfo, path: Path, line: int, name: str) -> np.ndarray:
    """A ``[tokens, layers, k]`` int64 array from nested JSON lists, shape-checked."""
    if not isinstance(raw, list):
        raise SourceError(path, f"expected a [tokens][layers][top_k] list, got {type(raw).__name__}",
                          line=line, field=name)
    if not raw:
        return np.zeros((0, model.num_layers, model.top_k), dtype=np.int64)
    try:
        arr = np.array(raw)
    except (ValueError, OverflowError):
        raise SourceError(path, "ragged lists, expected [tokens][layers][top_k]", line=line, field=name) from None
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
        raise SourceError(path, f"expected integer expert ids, got {arr.dtype.name} values", line=line, field=name)
    if arr.ndim != 3 or arr.shape[1:] != (model.num_layers, model.top_k):
        raise SourceError(path, f"shape {list(arr.shape)}, expected [tokens, {model.num_layers}, {model.top_k}] "
                                f"(layers, top_k of {model.name!r})", line=line, field=name)
    return arr.astype(np.int64)


def _import_vllm_json(path: Path, model: ModelInfo) -> tuple[dict[str, np.ndarray], TraceMeta]:
    parts: list[np.ndarray] = []
    lengths: list[tuple[int, int]] = []
    where: list[str] = []
    for i, (line, obj) in enumerate(_responses(path)):
        prompt_raw = obj.get("prompt_routed_experts")
        prompt = (np.zeros((0, model.num_layers, model.top_k), dtype=np.int64) if prompt_raw is None
                  else _id_array(prompt_raw, model, path, line, "prompt_routed_experts"))
        if "choices" in obj:
            choices = obj["choices"]
            if not isinstance(choices, list) or not choices:
                raise SourceError(path, "expected a non-empty list", line=line, field="choices")
            gens = []
            for c, ch in enumerate(choices):
                if not isinstance(ch, dict) or "routed_experts" not in ch:
                    raise SourceError(path, "missing (server started without --enable-return-routed-experts?)",
                                      line=line, field=f"choices[{c}].routed_experts")
                gens.append(_id_array(ch["routed_experts"], model, path, line, f"choices[{c}].routed_experts"))
        elif "routed_experts" in obj:
            gens = [_id_array(obj["routed_experts"], model, path, line, "routed_experts")]
        else:
            raise SourceError(path, "missing (no routed_experts and no choices)", line=line, field="routed_experts")
        for c, gen in enumerate(gens):
            if len(prompt) + len(gen) == 0:
                raise SourceError(path, "no routed tokens", line=line, field=f"choices[{c}].routed_experts")
            parts += [prompt, gen]
            lengths.append((len(prompt), len(gen)))
            where += [f"response {i}"] * (len(prompt) + len(gen))
    experts = np.concatenate(parts)
    starts = np.cumsum([0] + [p + d for p, d in lengths])
    _check_experts(experts, model, path,
                   lambda t, lay: f"{where[t]}, token {t - starts[np.searchsorted(starts, t, 'right') - 1]}, layer {lay}")
    source = {"importer": "vllm", "file": path.name, "sha256": sha256_file(path), "requests": len(lengths),
              "capture": "return-routed-experts responses"}
    return _columns(experts, np.asarray(lengths, dtype=np.int64)), TraceMeta(model=model, source=source)


def import_vllm(
    src: str | os.PathLike[str], *, model: ModelInfo,
    sidecar: str | os.PathLike[str] | None = None,
    request_lengths: Sequence[tuple[int, int]] | None = None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import a vLLM routed-experts capture: ``.json``/``.jsonl`` response files (see the
    module docstring; request boundaries come from the responses), or an integer ``.npy``
    array ``[tokens, layers, top_k]`` of all requests in order with per-request ``(prompt,
    decode)`` token counts from ``request_lengths``, from ``sidecar``, or from ``SRC`` with
    suffix ``.json`` when that file exists. vLLM captures no weights or logits, so the trace
    has ``experts`` only."""
    path = source_file(src)
    if path.suffix.lower() in (".json", ".jsonl"):
        if sidecar is not None or request_lengths is not None:
            raise MoesimError(f"{path}: response files carry their own request boundaries; "
                              "--sidecar and --request-lengths apply to .npy captures")
        return _import_vllm_json(path, model)
    return _import_vllm_npy(path, model, sidecar, request_lengths)


# --------------------------------------------------------------------------------------------
# SGLang


def _count(container: Any, key: str, path: Path, line: int, field: str) -> int:
    v = container.get(key) if isinstance(container, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > INT_LIMIT:
        raise SourceError(path, f"expected a non-negative integer, got {v!r}", line=line, field=field)
    return v


def _decode_ids(raw: Any, model: ModelInfo, path: Path, line: int, field: str) -> np.ndarray:
    if not isinstance(raw, str):
        raise SourceError(path, f"expected a base64 string, got {type(raw).__name__}", line=line, field=field)
    try:
        blob = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise SourceError(path, "not valid base64", line=line, field=field) from None
    per_token = model.num_layers * model.top_k
    if len(blob) % (4 * per_token):
        raise SourceError(path, f"{len(blob)} bytes is not a whole number of tokens of int32 "
                                f"[{model.num_layers} layers x top_k {model.top_k}]", line=line, field=field)
    return np.frombuffer(blob, dtype="<i4").astype(np.int64).reshape(-1, model.num_layers, model.top_k)


def import_sglang(src: str | os.PathLike[str], *, model: ModelInfo) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import SGLang ``return_routed_experts`` responses (module docstring). Each response
    (each choice of an OpenAI-style one) is a request: its first ``prompt_tokens`` rows are
    prefill, the rest decode. The ids cover ``prompt_tokens + completion_tokens - 1`` tokens
    (a capture that holds all ``prompt_tokens + completion_tokens`` is accepted too)."""
    path = source_file(src)
    parts: list[np.ndarray] = []
    lengths: list[tuple[int, int]] = []
    where: list[str] = []
    for i, (line, obj) in enumerate(_responses(path)):
        if "meta_info" in obj:
            meta = obj["meta_info"]
            if not isinstance(meta, dict):
                raise SourceError(path, "expected an object", line=line, field="meta_info")
            if "routed_experts" not in meta:
                raise SourceError(path, "missing (request sent without return_routed_experts?)",
                                  line=line, field="meta_info.routed_experts")
            p = _count(meta, "prompt_tokens", path, line, "meta_info.prompt_tokens")
            d = _count(meta, "completion_tokens", path, line, "meta_info.completion_tokens")
            found: list[tuple[Any, str, int, int | None]] = [(meta["routed_experts"], "meta_info.routed_experts", p, d)]
        elif "choices" in obj:
            usage = obj.get("usage")
            p = _count(usage, "prompt_tokens", path, line, "usage.prompt_tokens")
            choices = obj["choices"]
            if not isinstance(choices, list) or not choices:
                raise SourceError(path, "expected a non-empty list", line=line, field="choices")
            found = []
            for c, ch in enumerate(choices):
                ext = ch.get("sgl_ext") if isinstance(ch, dict) else None
                if not isinstance(ext, dict) or "routed_experts" not in ext:
                    raise SourceError(path, "missing (request sent without return_routed_experts?)",
                                      line=line, field=f"choices[{c}].sgl_ext.routed_experts")
                found.append((ext["routed_experts"], f"choices[{c}].sgl_ext.routed_experts", p, None))
        else:
            raise SourceError(path, "expected a /generate response (meta_info) or a completion (choices)",
                              line=line, field="meta_info")
        for raw, name, p, dec in found:
            ids = _decode_ids(raw, model, path, line, name)
            n = len(ids)
            if dec is not None and n not in (p + dec - 1, p + dec):
                raise SourceError(path, f"holds {n} tokens, expected prompt + completion - 1 = {p + dec - 1} "
                                        "(was routed_experts_start_len set?)", line=line, field=name)
            if n < p or n == 0:
                raise SourceError(path, f"holds {n} tokens, fewer than the {p} prompt tokens", line=line, field=name)
            parts.append(ids)
            lengths.append((p, n - p))
            where += [f"response {i}"] * n
    experts = np.concatenate(parts)
    starts = np.cumsum([0] + [p + d for p, d in lengths])
    _check_experts(experts, model, path,
                   lambda t, lay: f"{where[t]}, token {t - starts[np.searchsorted(starts, t, 'right') - 1]}, layer {lay}")
    source = {"importer": "sglang", "file": path.name, "sha256": sha256_file(path), "requests": len(lengths)}
    return _columns(experts, np.asarray(lengths, dtype=np.int64)), TraceMeta(model=model, source=source)


# --------------------------------------------------------------------------------------------
# llama.cpp moe-trace CSV


def _read_layer_expert_csv(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(layer, expert, line)`` arrays of a ``layer,expert`` CSV (optional header line)."""
    layers: list[int] = []
    experts: list[int] = []
    lines: list[int] = []
    for line, text in text_lines(path):
        row = text.strip()
        if not row:
            continue
        cells = [c.strip() for c in row.split(",")]
        if line == 1 and cells == ["layer", "expert"]:
            continue
        if len(cells) != 2:
            raise SourceError(path, f"has {len(cells)} fields, expected 2 (layer,expert)", line=line)
        for cell, name, out in ((cells[0], "layer", layers), (cells[1], "expert", experts)):
            if not cell.isascii() or not cell.isdigit() or len(cell) > 9:
                raise SourceError(path, f"expected a non-negative integer below 10**9, got {cell[:40]!r}",
                                  line=line, field=name)
            out.append(int(cell))
        lines.append(line)
    if not lines:
        raise SourceError(path, "no rows")
    return np.asarray(layers, dtype=np.int64), np.asarray(experts, dtype=np.int64), np.asarray(lines, dtype=np.int64)


def import_llamacpp(
    src: str | os.PathLike[str], *, model: ModelInfo,
    request_lengths: Sequence[tuple[int, int]] | None = None,
) -> tuple[dict[str, np.ndarray], TraceMeta]:
    """Import the ``layer,expert`` CSV of llama.cpp's ``moe-trace`` example (module
    docstring): micro-batches are recovered from the runs of equal layer numbers, tokens from
    ``top_k`` rows each. ``request_lengths`` splits the tokens into requests ``(prompt,
    decode)``; by default the capture is one request whose prompt is the leading
    multi-token micro-batches."""
    path = source_file(src)
    layer, expert, lines = _read_layer_expert_csv(path)
    L, k = model.num_layers, model.top_k
    ids = np.unique(layer)
    if len(ids) != L:
        raise SourceError(path, f"{len(ids)} distinct layer numbers ({' '.join(map(str, ids[:8]))}"
                                f"{' ...' if len(ids) > 8 else ''}), model {model.name!r} has {L} MoE layers",
                          line=int(lines[0]), field="layer")
    moe_layer = np.searchsorted(ids, layer)
    # runs of equal layer numbers; a micro-batch is L runs in layer order
    run_start = np.flatnonzero(np.concatenate([[True], moe_layer[1:] != moe_layer[:-1]]))
    run_len = np.diff(np.append(run_start, len(layer)))
    run_layer = moe_layer[run_start]
    if L == 1:  # one MoE layer: micro-batches cannot be told apart; one run of all tokens
        run_start, run_len, run_layer = run_start[:1], np.asarray([len(layer)]), run_layer[:1]
    want = np.arange(len(run_start)) % L
    bad = np.flatnonzero(run_layer != want)
    if bad.size:
        r = int(bad[0])
        raise SourceError(path, f"layer {ids[run_layer[r]]} where layer {ids[want[r]]} was expected "
                                "(each micro-batch lists every MoE layer once, in order)",
                          line=int(lines[run_start[r]]), field="layer")
    if len(run_start) % L:
        r = len(run_start) - 1
        raise SourceError(path, f"the last micro-batch stops after layer {ids[run_layer[r]]} (capture cut short?)",
                          line=int(lines[run_start[r]]), field="layer")
    odd = np.flatnonzero(run_len % k)
    if odd.size:
        r = int(odd[0])
        raise SourceError(path, f"layer {ids[run_layer[r]]} has {run_len[r]} rows here, not a multiple of "
                                f"top_k {k}", line=int(lines[run_start[r]]), field="expert")
    ub_tokens = run_len.reshape(-1, L) // k
    uneven = np.flatnonzero((ub_tokens != ub_tokens[:, :1]).any(axis=1))
    if uneven.size:
        u = int(uneven[0])
        r = u * L + int(np.flatnonzero(ub_tokens[u] != ub_tokens[u, 0])[0])
        raise SourceError(path, f"layer {ids[run_layer[r]]} routes {ub_tokens.reshape(-1)[r]} tokens in this "
                                f"micro-batch, layer {ids[0]} routed {ub_tokens[u, 0]}",
                          line=int(lines[run_start[r]]), field="expert")
    # [ubatch, layer, tokens, k] -> [tokens, layer, k], micro-batch by micro-batch
    blocks = []
    line_blocks = []
    pos = 0
    for n_tok in ub_tokens[:, 0]:
        size = int(n_tok) * L * k
        blk = expert[pos: pos + size].reshape(L, int(n_tok), k).transpose(1, 0, 2)
        blocks.append(blk)
        line_blocks.append(lines[pos: pos + size].reshape(L, int(n_tok), k).transpose(1, 0, 2)[:, :, 0])
        pos += size
    experts = np.concatenate(blocks)
    tok_lines = np.concatenate(line_blocks)
    tokens = len(experts)

    def locate(t: int, lay: int) -> str:
        return f"line {tok_lines[t, lay]} (token {t}, layer {ids[lay]})"

    _check_experts(experts, model, path, locate)
    if request_lengths is not None:
        lengths = _split(request_lengths, tokens, "--request-lengths", f"the capture {path.name}")
    else:
        multi = ub_tokens[:, 0] > 1
        lead = int(np.argmin(multi)) if not multi.all() else len(multi)
        prompt = int(ub_tokens[:max(lead, 1), 0].sum())
        lengths = np.asarray([[prompt, tokens - prompt]], dtype=np.int64)
    source = {"importer": "llamacpp", "file": path.name, "sha256": sha256_file(path), "requests": len(lengths),
              "layers": f"block indices {' '.join(map(str, ids))} renumbered 0..{L - 1}"}
    return _columns(experts, lengths), TraceMeta(model=model, source=source)
