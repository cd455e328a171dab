"""Cheaper construction of the contract's frozen, slotted dataclasses on the engine's hot path.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (frozen
classes refuse plain assignment), which costs about three times what writing the slots directly
does. :func:`slot_maker` builds, for such a class, a function of the same positional fields
that creates the instance without ``__init__`` and writes each slot through its descriptor: the
same object (equal, same repr, still frozen), made for each eviction request and routing.
Only for classes whose ``__init__`` does nothing else (no defaults used, no ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def slot_maker(cls: type) -> Callable[..., Any]:
    """A function ``make(*fields)`` equal to ``cls(*fields)`` for a frozen, slotted dataclass
    without ``__post_init__`` (checked), taking every field positionally."""
    if not (dataclasses.is_dataclass(cls) and hasattr(cls, "__slots__")):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__: build it with its constructor")
    names = [f.name for f in dataclasses.fields(cls)]
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    env.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    body = "\n".join(f"    _set_{n}(obj, {n})" for n in names)
    src = f"def make({', '.join(names)}):\n    obj = _new(_cls)\n{body}\n    return obj\n"
    exec(src, env)
    make: Callable[..., Any] = env["make"]
    make.__doc__ = f"``{cls.__name__}({', '.join(names)})``, written through its slots."
    return make
