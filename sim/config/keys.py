"""Did-you-mean for dotted scenario keys: the fields a pydantic model accepts at a YAML path
(``cache.rat`` -> ``cache.rate``), for the one-line errors of scenario files and ``--set``."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``CacheSpec`` or ``str | PolicySpec``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = model_of(arg)
        if found is not None:
            return found
    return None


def fields_at(root: type[BaseModel], path: Sequence[str]) -> list[str] | None:
    """The field names of the model found at ``path`` inside ``root`` (``[]``: ``root``'s own),
    or None where the path leaves the models (a free mapping, a list, an unknown key)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None or part not in model.model_fields:
            return None
        model = model_of(model.model_fields[part].annotation)
    return None if model is None else list(model.model_fields)


def did_you_mean(name: str, known: Iterable[str], *, prefix: str = "") -> str:
    """``"; did you mean 'prefix.close'?"`` for the closest known name, else the list of known
    names (difflib's ratio, as every did-you-mean of moesim)."""
    names = list(known)
    close = difflib.get_close_matches(name, names, n=1)
    dotted = [f"{prefix}{n}" for n in names]
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    return f"; known: {', '.join(dotted)}" if names else ""


def unknown_key_hint(root: type[BaseModel], loc: Sequence[str]) -> str:
    """The did-you-mean of an unknown key at dotted location ``loc`` of a ``root`` document
    (empty when the parent is not a model of known fields)."""
    if not loc:
        return ""
    known = fields_at(root, loc[:-1])
    if known is None:
        return ""
    prefix = ".".join(loc[:-1]) + "." if len(loc) > 1 else ""
    return did_you_mean(loc[-1], known, prefix=prefix)
