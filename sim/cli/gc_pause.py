"""The cyclic garbage collector paused while ``simctl``'s own modules load.

Importing the command tree (typer, rich and the modules they pull in) allocates tens of
thousands of objects, none of them garbage, and the collector's passes over them (38 young and
4 middle-generation ones, that freed nothing) cost about a tenth of that import's CPU time:
~10 ms of every ``simctl`` process (the median of 20 paired imports on a loaded two-core
machine, 95 vs 83 ms). :func:`main
<moesim.sim.cli.main.main>` pauses the collector itself while the command line is parsed and
the command's modules load; this covers the imports before it, at the top of the CLI module.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block and put it back as it was (a program that
    had it off keeps it off); objects are never freed late by more than the block."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
