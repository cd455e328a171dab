"""One registry of policies, keyed by name. Adding a policy touches one file besides its own:
its module decorates the class with :func:`register` and is listed in ``_MODULES`` with the
names it registers (looking one name up imports only its module); a policy of your own,
outside the package, registers itself the same way from a file a scenario lists under
``plugins:`` (:mod:`moesim.policies.contract.plugins`)."""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import typing
from typing import Any, TypeVar

from moesim.policies.contract.base import Policy
from moesim.sim.core.errors import MoesimError

_REGISTRY: dict[str, type[Policy]] = {}
_MODULES: dict[str, tuple[str, ...]] = {
    # module: the names it registers (a lookup imports only the module that holds the name;
    # tests/test_registry_modules.py checks this table against the classes themselves)
    "moesim.policies.baselines.caching": ("lru", "lfu", "fifo", "random", "static", "no-cache"),
    "moesim.policies.baselines.belady": ("belady",),
    "moesim.policies.baselines.speculative": ("mixtral-offloading", "oracle-prefetch"),
    "moesim.policies.baselines.lcp": ("lcp",),
    "moesim.policies.moepic.policy": ("moepic",),
    "moesim.policies.moepic.variants": ("moepic-cache-only", "moepic-prefetch-only"),
    "moesim.policies.baselines.adapmoe": ("adapmoe",),
    "moesim.policies.baselines.moe_infinity": ("moe-infinity",),
    "moesim.policies.baselines.pregated": ("pregated",),
    "moesim.policies.baselines.random_substitute": ("random-substitute",),
    "moesim.policies.activeevict.policy": ("activeevict",),
    "moesim.policies.baselines.moe_apex": ("moe-apex-style",),
    "moesim.policies.fmoe.policy": ("fmoe",),
    "moesim.policies.baselines.promoe": ("promoe-style",),
    "moesim.policies.buddymoe.policy": ("buddymoe",),
    "moesim.policies.commitmoe.policy": ("commitmoe", "prefetch-fallback"),
    "moesim.policies.baselines.lfru": ("lfru",),
    "moesim.policies.baselines.least_stale": ("least-stale",),
    "moesim.policies.llamacpp.policy": ("cpu-moe",),
    "moesim.policies.fiddler.policy": ("fiddler",),
    "moesim.policies.baselines.accelerate": ("accelerate",),
    "moesim.policies.baselines.vllm_offload": ("vllm-offload",),
}
_MODULE_OF = {name: mod for mod, names in _MODULES.items() for name in names}
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


def load_builtin_policies() -> None:
    """Import every built-in policy module (once), so that the registry lists them all."""
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod)
        _loaded = True


def policy_names() -> list[str]:
    load_builtin_policies()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``: importing only the module that holds a built-in
    policy; an unknown name is one line with the closest known name."""
    if name not in _REGISTRY and name in _MODULE_OF:
        importlib.import_module(_MODULE_OF[name])
    if name not in _REGISTRY:
        load_builtin_policies()
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


def _exemplar(cls: type[Policy], name: str, default: Any) -> Any:
    """A value of the parameter's type: its default, or for a ``None`` default a value of the
    first of bool, int, float, str its annotation allows (``int | None`` -> 0)."""
    if default is not None:
        return default
    try:
        hint = typing.get_type_hints(cls.__init__).get(name)
    except Exception:  # an annotation that does not resolve: no check
        return None
    args = typing.get_args(hint) or (hint,)
    for t, sample in ((bool, False), (int, 0), (float, 0.0), (str, "")):
        if t in args:
            return sample
    return None


def _type_problem(default: Any, value: Any) -> str | None:
    """Why ``value`` cannot stand for a parameter whose default is ``default`` (a flag needs
    true/false, a count an integer, a real a finite number, a choice a string), or None."""
    def got() -> str:
        return f"got {type(value).__name__} {value!r}"

    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"expected true or false, {got()}"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else f"expected an integer, {got()}"
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, {got()}"
        return None if math.isfinite(value) else f"expected a finite number, {got()}"
    if isinstance(default, str):
        return None if isinstance(value, str) else f"expected a string, {got()}"
    return None


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
        problem = None if params[key] is None and known[key] is None else \
            _type_problem(_exemplar(cls, key, known[key]), params[key])
        if problem:
            raise PolicyError(f"policy {name!r}: {key}: {problem}")
    try:
        policy = cls(**params)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
    problem = unstored_param(policy, params)
    if problem:
        raise PolicyError(problem)
    return policy


def unstored_param(policy: Policy, given: dict[str, Any] | None = None) -> str | None:
    """Why ``policy`` breaks the parameter rule (scikit-learn's): each keyword parameter of its
    ``__init__`` is kept as an attribute of the same name, unchanged (the value in ``given``,
    else the declared default), so that :meth:`~Policy.get_params` reads the parameters back and
    a run's outputs can name them; None when it keeps them all. Checked on every policy a
    scenario builds, before the run."""
    given = given or {}
    for key, default in policy_params(type(policy)).items():
        expected = given.get(key, default)
        if not hasattr(policy, key):
            return (f"policy {policy.name!r} does not store its parameter {key!r}: its __init__ must keep "
                    f"each keyword as an attribute of the same name (self.{key} = {key})")
        kept = getattr(policy, key)
        try:
            same = kept is expected or bool(kept == expected)
        except Exception:  # a value whose == is not one truth value: compare by identity only
            same = False
        if not same:
            return (f"policy {policy.name!r} changes its parameter {key!r}: given {expected!r}, it keeps "
                    f"{kept!r} (keep each keyword as given; derive other values under another name)")
    return None
