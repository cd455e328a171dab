"""The cyclic garbage collector paused while ``simctl``'s own modules load.

Importing the command tree (typer, rich and the modules they pull in) allocates tens of
thousands of objects, none of them garbage, and the collector's passes over them (38 young and
4 middle-generation ones, that freed nothing) cost about a tenth of that import's CPU time:
~10 ms of every ``simctl`` process (the median of 20 paired imports on a loaded two-core
machine, 95 vs 83 ms). :func:`main
<moesim.sim.cli.main.main>` pauses the collector itself while the command line is parsed and
the command's modules load; this covers the imports before it, at the top of the CLI module.

When the block ends, what it imported is moved out of the collector's sight for good
(:func:`gc.freeze`, as :func:`main <moesim.sim.cli.main.main>` does with the command's own
modules when it resumes the collector): otherwise the first allocation after the block starts a
young-generation pass over every object the imports made (~30,000: modules, classes, functions,
none of them garbage), and the middle-generation passes after it go over them again: ~11 ms of
collector time in a ``simctl run`` (gc callbacks, 12.7 ms before, 1.8 after), ~20 ms of CPU in
a process that only imports the CLI (the median of 15 paired ``python -c 'import
moesim.sim.cli.main'``: 86 vs 109 ms). The few objects the imports left as cyclic garbage stay
allocated.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block and put it back as it was (a program that
    had it off keeps it off, and nothing is frozen); when it was on, the objects alive at the
    end of the block are frozen (:func:`gc.freeze`) before it resumes."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.freeze()
            gc.enable()
