"""One registry of policies, keyed by name. Adding a policy touches one file: its module
decorates the class with :func:`register` and is listed in ``_MODULES``."""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, TypeVar

from moesim.policies.base import Policy
from moesim.sim.errors import MoesimError

_REGISTRY: dict[str, type[Policy]] = {}
_MODULES = (
    "moesim.policies.caching",
    "moesim.policies.belady",
    "moesim.policies.speculative",
    "moesim.policies.lcp",
    "moesim.policies.moepic",
    "moesim.policies.adapmoe",
    "moesim.policies.moe_infinity",
    "moesim.policies.pregated",
    "moesim.policies.random_substitute",
)
_loaded = False

P = TypeVar("P", bound=type[Policy])


class PolicyError(MoesimError, ValueError):
    """Unknown policy name or bad policy parameters."""


def register(cls: P) -> P:
    """Class decorator: add ``cls`` to the registry under ``cls.name`` (unique)."""
    name = cls.name
    if not name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"duplicate policy name {name!r}: {_REGISTRY[name].__qualname__} and {cls.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod)
        _loaded = True


def policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    _load_all()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(_REGISTRY))}"
        raise PolicyError(f"unknown policy {name!r}{hint}")
    return _REGISTRY[name]


def policy_params(cls: type[Policy]) -> dict[str, Any]:
    """The keyword parameters of a policy class and their defaults."""
    sig = inspect.signature(cls.__init__)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Build a policy by name. Unknown parameters are errors, never ignored."""
    cls = policy_class(name)
    params = dict(params or {})
    known = policy_params(cls)
    for key in params:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; it takes: {', '.join(known)}" if known else "; it takes no parameters")
            raise PolicyError(f"policy {name!r} has no parameter {key!r}{hint}")
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
