"""pydantic's plugin scan, skipped while a ``simctl`` command runs.

The first time a process builds a pydantic model or adapter, pydantic looks for plugins: it
reads the entry points of every installed distribution (the ``pydantic`` group). That costs
about 5 ms of CPU a process (on a venv of ~130 distributions; :mod:`importlib.metadata` itself
is imported by pydantic either way), for plugins (observability hooks such as logfire's) that
moesim's models do not use.
``PYDANTIC_DISABLE_PLUGINS=__all__`` (pydantic's documented switch) skips the scan; a value the
user set, to any value (``PYDANTIC_DISABLE_PLUGINS=`` with none keeps every plugin), is kept.
Validation and every result are unchanged.
"""

from __future__ import annotations

import os

VARIABLE = "PYDANTIC_DISABLE_PLUGINS"
"""pydantic's switch: ``__all__`` loads no plugin."""


def skip_plugin_scan() -> bool:
    """Set :data:`VARIABLE` to ``__all__`` unless the user set it; returns whether it was set
    (then :func:`restore` takes it back when the command ends)."""
    if VARIABLE in os.environ:
        return False
    os.environ[VARIABLE] = "__all__"
    return True


def restore(was_set: bool) -> None:
    """Undo :func:`skip_plugin_scan` (``was_set``: what it returned), so that a program that
    called ``simctl``'s :func:`main <moesim.sim.cli.main.main>` in-process keeps its own setting."""
    if was_set:
        os.environ.pop(VARIABLE, None)
