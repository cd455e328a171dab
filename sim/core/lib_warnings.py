"""Deprecation notices of torch and transformers, kept from the user while moesim calls them.

``FutureWarning: `past_key_values` is deprecated ... for MixtralForCausalLM.forward`` and the
like are about how moesim drives those libraries, and a user of ``simctl trace record`` or
``simctl calibrate`` can do nothing about them. :func:`quiet_library_warnings` hides exactly
those (``FutureWarning`` and ``DeprecationWarning`` raised from inside the libraries' own
modules) while moesim's code runs, as a context manager or a decorator on the functions that
call the libraries. Outside those calls, in the user's own code, every warning shows as before.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

LIBRARIES = r"(torch|transformers|huggingface_hub|safetensors|accelerate)(\.|$)"
"""The modules (and their submodules) whose deprecation notices are hidden."""


@contextlib.contextmanager
def quiet_library_warnings() -> Iterator[None]:
    """Within the block (or the decorated function): no ``FutureWarning`` or
    ``DeprecationWarning`` whose origin is a module of :data:`LIBRARIES`; the warning filters
    are restored on the way out (Python's ``catch_warnings``)."""
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=LIBRARIES)
        yield
