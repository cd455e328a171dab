"""The moe-trace v1 schema and metadata: column names, the Arrow schema, phases, the file
metadata (:class:`TraceMeta`, :class:`ModelInfo`) and :class:`TraceError`.

The file format itself (the contract) is described in :mod:`traces.format`, which reads and
writes files; :mod:`traces.validation` checks rows against what is defined here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from moesim.sim.core.errors import MoesimError

TRACE_VERSION = 1
META_KEY = b"moe_trace"
PHASES = ("prefill", "decode")
PREFILL, DECODE = 0, 1

REQUIRED_COLUMNS = ("request_id", "token_idx", "phase", "layer", "experts")
OPTIONAL_COLUMNS = ("weights", "logits", "lookahead_logits", "token_id", "embedding")
ALL_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS

SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int32(), nullable=False),
        pa.field("token_idx", pa.int32(), nullable=False),
        pa.field("phase", pa.dictionary(pa.int8(), pa.string()), nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
        pa.field("experts", pa.list_(pa.int16()), nullable=False),
        pa.field("weights", pa.list_(pa.float32())),
        pa.field("logits", pa.list_(pa.float16())),
        pa.field("lookahead_logits", pa.list_(pa.float16())),
        pa.field("token_id", pa.int32()),
        pa.field("embedding", pa.list_(pa.float16())),
    ]
)

DEFAULT_BATCH_ROWS = 65_536


class TraceError(MoesimError, ValueError):
    """A trace that breaks the moe-trace v1 contract. ``str(err)`` is one line that names the
    file and, where it applies, the row and the column."""

    def __init__(
        self, path: str | os.PathLike[str] | None, message: str, *,
        row: int | None = None, column: str | None = None,
    ) -> None:
        where = [str(path) if path is not None else "<trace>"]
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(": ".join([", ".join(where), message]))
        self.path, self.row, self.column = path, row, column


@dataclass(frozen=True)
class ModelInfo:
    """The routed-expert shape of the traced model."""

    name: str
    num_layers: int
    num_experts: int
    top_k: int
    num_shared_experts: int = 0

    def __post_init__(self) -> None:
        for attr in ("num_layers", "num_experts", "top_k"):
            if int(getattr(self, attr)) < 1:
                raise ValueError(f"model.{attr} must be >= 1, got {getattr(self, attr)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"model.top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_shared_experts < 0:
            raise ValueError("model.num_shared_experts must be >= 0")


@dataclass(frozen=True)
class TraceMeta:
    """File-level metadata: format version, model shape and free-form provenance."""

    model: ModelInfo
    source: dict[str, Any] = field(default_factory=dict)
    version: int = TRACE_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "model": {
                    "name": self.model.name,
                    "num_layers": self.model.num_layers,
                    "num_experts": self.model.num_experts,
                    "top_k": self.model.top_k,
                    "num_shared_experts": self.model.num_shared_experts,
                },
                "source": self.source,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes, path: str | os.PathLike[str] | None = None) -> TraceMeta:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"metadata {META_KEY.decode()!r} is not valid JSON ({exc.msg})") from None
        except UnicodeDecodeError:
            raise TraceError(path, f"metadata {META_KEY.decode()!r} is not UTF-8 text") from None
        except RecursionError:
            raise TraceError(path, f"metadata {META_KEY.decode()!r} is nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise TraceError(path, f"metadata {META_KEY.decode()!r} must be a JSON object")
        version = obj.get("version")
        if type(version) is not int or version != TRACE_VERSION:
            raise TraceError(path, f"unsupported moe-trace version {version!r} (this reader knows {TRACE_VERSION})")
        model = obj.get("model")
        if not isinstance(model, dict):
            raise TraceError(path, "metadata has no 'model' object")
        for key in ("num_layers", "num_experts", "top_k", "num_shared_experts"):
            v = model.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TraceError(path, f"metadata model.{key} must be an integer, got {v!r}")
        try:
            info = ModelInfo(
                name=str(model["name"]),
                num_layers=int(model["num_layers"]),
                num_experts=int(model["num_experts"]),
                top_k=int(model["top_k"]),
                num_shared_experts=int(model.get("num_shared_experts", 0)),
            )
        except KeyError as exc:
            raise TraceError(path, f"metadata model is missing {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise TraceError(path, f"metadata model is invalid: {exc}") from None
        source = obj.get("source", {})
        return cls(model=info, source=source if isinstance(source, dict) else {"value": source})
