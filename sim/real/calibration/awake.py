"""Keep every processor awake while the CPU executor is timed.

On a virtual machine an idle virtual CPU is halted by the hypervisor, and waking it (a thread
that was sleeping on a lock, such as the executor's copy thread or the main thread waiting
for a copy) takes a round trip through the host. On the 2-vCPU machine this project is
developed on, a 0.2 MB copy handed to the copy thread and waited for took 42-47 us with every
vCPU busy and 45-118 us, varying from one measurement to the next, with them idle
(``python -c 'from moesim.sim.real.calibration.bench import copy_bench; ...'``, 4 rounds each).
The copy engine the CPU executor stands in for (a GPU's DMA engine) has no such wake-up, and
a calibration measured in one regime would not describe a run in the other.

:func:`cpus_awake` starts one busy loop per CPU at the lowest scheduling class
(``SCHED_IDLE``): it runs only when nothing else wants the CPU and yields at once to any
thread that wakes, so the vCPUs never halt and no timed thread waits behind it. Linux only;
elsewhere it does nothing and says so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

_SPIN = ("import os\n"
         "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "while True:\n    pass\n")


def can_keep_awake() -> bool:
    """True where idle-class busy loops are available (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE")


@contextlib.contextmanager
def cpus_awake(enabled: bool = True) -> Iterator[bool]:
    """Within the block, one ``SCHED_IDLE`` busy loop per CPU keeps the processors out of their
    idle state. Yields whether the loops run (False when disabled or not on Linux)."""
    if not enabled or not can_keep_awake():
        yield False
        return
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(os.cpu_count() or 1)]
    try:
        yield True
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
