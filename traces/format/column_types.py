"""The kind of Arrow type each moe-trace v1 column must have (integers, floats, strings, lists
of one depth), so that a file with experts as strings or floats, or nested one level too deep,
is refused by name before any value is read (see :func:`moesim.traces.format.trace_file.check_schema`)."""

from __future__ import annotations

import pyarrow as pa


def arrow_kind(t: pa.DataType) -> str:
    """What an Arrow type holds, as the schema check names it."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_dictionary(t):
        return f"dictionary of {arrow_kind(t.value_type)}"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list of {arrow_kind(t.value_type)}"
    return str(t)


EXPECTED_KIND: dict[str, tuple[str, ...]] = {
    "request_id": ("integer",), "token_idx": ("integer",), "layer": ("integer",), "token_id": ("integer",),
    "phase": ("string", "dictionary of string"),
    "experts": ("list of integer",), "weights": ("list of float",), "logits": ("list of float",),
    "lookahead_logits": ("list of float",), "embedding": ("list of float",),
}
"""Column name -> the kinds (as :func:`arrow_kind` names them) its Arrow type may have."""


def kind_problem(name: str, t: pa.DataType) -> str | None:
    """What is wrong with column ``name`` having Arrow type ``t``, or None."""
    kind = arrow_kind(t)
    if kind in EXPECTED_KIND[name]:
        return None
    return f"has Arrow type {t} ({kind}); expected {' or '.join(EXPECTED_KIND[name])}"
