"""One writer per output folder: an advisory lock (``flock``) held on the folder itself.

Two studies started on one folder would run every point twice and remove each other's
temporary files; the second is refused at once with one line instead. The lock is the kernel's
(released when the process ends, even by SIGKILL), so a killed study never leaves a stale lock.
Where ``fcntl`` is missing (Windows) there is no lock.
"""

from __future__ import annotations

import os
from pathlib import Path

from moesim.sim.core.atomic import OutputError


class FolderLock:
    """An exclusive lock on ``folder``, taken at once or refused (:class:`OutputError`); it
    follows the folder through renames (it is held on the folder, not on its name)."""

    def __init__(self, folder: Path, *, option: str = "--out", shown: Path | None = None) -> None:
        self.fd: int | None = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        name = shown if shown is not None else folder
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError as exc:
            raise OutputError(f"{option} {name}: cannot open the folder ({os.strerror(exc.errno or 0)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OutputError(f"{option} {name}: another simctl is writing this folder now; wait for it to "
                              f"end, or give another {option}") from None
        self.fd = fd

    def release(self) -> None:
        """Let the folder go (closing the descriptor drops the lock)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
