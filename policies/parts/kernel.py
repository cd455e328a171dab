"""The capability a policy part declares when a kernel of the simulator's fast path
(:mod:`moesim.sim.fast`) reproduces it exactly: its ``kernel`` name. The fast path chooses a
kernel by these names (and reads the parts' state through their public accessors), never by a
part's class.

A cache rule's name is that of the decider it declares (:mod:`moesim.policies.parts.deciders`,
:class:`~moesim.policies.parts.caches.CacheRule`). A name holds only for the class that
declares it in its own body: every subclass starts again from None, since it may change any
hook, and declares the name anew only if the kernel still reproduces it.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DeclaresKernel:
    """Mixin of the parts a kernel may stand in for (cache rules, prefetchers, predictors)."""

    kernel: ClassVar[str | None] = None
    """The kernel that reproduces this class exactly (None: only its hooks do)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kernel" not in cls.__dict__:
            cls.kernel = None
