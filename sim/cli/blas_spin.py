"""numpy's OpenBLAS workers, told to sleep at once instead of spinning when a ``simctl``
process starts.

When numpy is imported, its OpenBLAS starts one worker thread per core, and each busy-waits
for work for about 2**28 cycles (a tenth of a second) before it sleeps. A ``simctl`` command
makes no BLAS call that such a spin would speed up, yet the spinning worker takes a core: on a
2-core machine it made ``import numpy`` 0.146 s instead of 0.091 s of wall time and ``simctl
run`` (Mixtral, 64,000 layer-steps, lru) about 60 ms slower. ``OPENBLAS_THREAD_TIMEOUT=4``
(OpenBLAS's shortest spin, 2**4 cycles) lets them sleep at once. The number of workers, so
every result, is unchanged; a value the user set is kept.

Commands that time real compute (``calibrate``, ``validate``) are left as they are, so that
what they measure is what the user's settings give.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

TIMED = frozenset({"calibrate", "validate"})
"""Commands that measure compute on this machine: their BLAS set-up is the user's."""


def quiet_blas_workers(argv: Sequence[str]) -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT=4`` for a command about to run, before numpy is first
    imported (it is read when OpenBLAS starts): not when numpy is already loaded, the user set
    it, or the command is one of :data:`TIMED`. Returns whether it was set."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if "numpy" in sys.modules or command in TIMED or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
    return True
