"""Worker processes that never outlive the command that started them.

The sweep and fit pools start their workers through multiprocessing's forkserver: a worker's
parent is the fork server, not the command, and the fork server and the resource tracker live
as long as any worker holds their pipes. A worker waits for tasks on a queue whose other end
its siblings hold too, so after ``kill -9`` of the command nothing would ever end them. Hence
each worker, from its initializer (:func:`start_worker`):

* watches the command's process (its pid and its start time, so that a reused pid is not taken
  for it) from a daemon thread, and ends itself at once when the command is gone or a zombie;
  the fork server and the resource tracker then see their pipes close and end as well;
* asks Linux to kill it when its parent (the fork server) dies (``PR_SET_PDEATHSIG``);
* ignores Ctrl-C: the terminal sends SIGINT to the whole process group, and the command, not
  each worker, decides what an interrupt means (:func:`stop_pool` ends the workers at once).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WATCH_S = 0.2
"""How often a worker looks whether its command is still there (seconds)."""
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Parent:
    """The command's process as a worker checks it: its pid and its start time (in clock ticks
    since boot, Linux's ``/proc/PID/stat`` field 22; None where there is no ``/proc``)."""

    pid: int
    start: int | None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of a process from ``/proc``, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()   # after the command name, which may hold spaces
    return fields[0], int(fields[19])


def this_process() -> Parent:
    """The calling process, as its workers will watch it."""
    stat = _proc_stat(os.getpid())
    return Parent(os.getpid(), None if stat is None else stat[1])


def alive(parent: Parent) -> bool:
    """Whether the command's process still runs (not gone, not a zombie, not a reused pid)."""
    if parent.start is None:   # no /proc: a signal 0 says whether the pid exists
        try:
            os.kill(parent.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = _proc_stat(parent.pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == parent.start


def _watch(parent: Parent) -> None:
    stop = threading.Event()
    while not stop.wait(WATCH_S):
        if not alive(parent):
            os._exit(1)   # nothing to save: the command that wanted the results is gone


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (best effort elsewhere: nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:   # the parent died before the request: too late for the signal
        os._exit(1)


def start_worker(parent: Parent, init: Callable[..., None] | None = None, *args: Any) -> None:
    """A pool worker's initializer: tie the worker's life to ``parent`` (see the module), then
    run ``init(*args)``, the pool's own initializer, if any."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    threading.Thread(target=_watch, args=(parent,), name="moesim-parent-watch", daemon=True).start()
    if init is not None:
        init(*args)


def stop_pool(pool: Any) -> None:
    """End a ``ProcessPoolExecutor``'s workers now (an interrupted study): queued tasks are
    cancelled and running ones killed, rather than waited for."""
    procs = list((getattr(pool, "_processes", None) or {}).values())   # no public handle before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
