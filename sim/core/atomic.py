"""Output files and folders that appear whole or not at all.

Every command that writes (``run --out``, ``calibrate -o``, ``trace synth/import/record -o``,
``validate --out``) writes into a hidden temporary sibling named ``.NAME.moesim-tmp-PID`` and
renames it into place at the end, so a failure or a kill never leaves a half-written output
under the name the user gave. A later write to the same name removes such leftovers whose
process is gone. An existing non-empty output is refused unless ``force`` (``--force``), and
then replaced in one rename. While a temporary sibling exists, SIGTERM unwinds the process as
Ctrl-C does (:func:`terminate_cleanly`), so ``kill PID`` removes it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from moesim.sim.core.errors import MoesimError

TMP_TAG = ".moesim-tmp-"
"""Marks the temporary siblings: ``.NAME.moesim-tmp-PID[suffix]``."""


class OutputError(MoesimError, ValueError):
    """An output path that cannot be written; the message names it and the option."""


class Terminated(BaseException):
    """SIGTERM arrived while an output was being written (see :func:`terminate_cleanly`). A
    ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` swallows it
    and every ``finally`` on the way out runs; ``simctl`` ends with exit status 143."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"terminated by signal {signum}")


@contextlib.contextmanager
def terminate_cleanly() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` instead of ending the process at
    once, so the cleanup of the temporary outputs runs (Python does that for Ctrl-C already).
    Only in the main thread and only where SIGTERM has its default action: a handler that an
    application installed (Dask, a notebook kernel) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, AttributeError):   # no SIGTERM on this platform
        yield
        return
    if previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_target(path: Path, *, option: str, folder: bool, force: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written: a parent that is a file, a
    folder where a file goes (or the reverse), an existing output without ``force``, a place
    without write permission. Writes nothing."""
    path = Path(path)
    for anc in reversed(path.parents):
        if anc.exists() and not anc.is_dir():
            raise OutputError(f"{option} {path}: {anc} is a file, not a folder")
    if path.exists():
        if folder and not path.is_dir():
            raise OutputError(f"{option} {path}: exists and is a file, not a folder")
        if not folder and path.is_dir():
            raise OutputError(f"{option} {path}: is a folder; give a file name")
        if folder and any(path.iterdir()) and not force:
            raise OutputError(f"{option} {path}: the folder exists and is not empty; add --force to replace it")
        if not folder and not force:
            raise OutputError(f"{option} {path}: the file exists; add --force to replace it")
    base = _nearest_existing(path.parent)
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot write in {base} (permission denied)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(path: Path) -> None:
    """Remove temporary siblings of ``path`` left by processes that no longer run."""
    parent = path.parent
    if not parent.is_dir():
        return
    for p in parent.glob(f".{path.name}{TMP_TAG}*"):
        pid_text = p.name[len(f".{path.name}{TMP_TAG}"):].split(".")[0].split("-")[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _alive(int(pid_text)):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()


def _mkparent(path: Path, option: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot create the folder ({_reason(exc)})") from None


@contextlib.contextmanager
def atomic_folder(path: str | Path, *, option: str = "--out", force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success it becomes ``path`` (replacing an old one
    only with ``force``); on any failure it is removed and ``path`` is untouched."""
    out = Path(path)
    check_target(out, option=option, folder=True, force=force)
    _mkparent(out, option)
    clean_stale(out)
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with terminate_cleanly():
        try:
            tmp.mkdir()
        except OSError as exc:
            raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
        try:
            yield tmp
            old = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-old"
            if out.exists():
                out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: str | Path, *, option: str = "-o", force: bool = False) -> Iterator[Path]:
    """Yield a temporary file path (same folder and suffix) to write; on success it replaces
    ``path`` in one rename; on any failure it is removed and ``path`` is untouched."""
    out = Path(path)
    check_target(out, option=option, folder=False, force=force)
    _mkparent(out, option)
    clean_stale(out)
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}{out.suffix}"
    with terminate_cleanly():
        try:
            yield tmp
            os.replace(tmp, out)
        except OSError as exc:
            raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _reason(exc: OSError) -> str:
    """The OS's words for an error (``Permission denied``), without the library's decoration
    (pyarrow puts the whole file path and a "Detail:" into its message)."""
    if exc.errno:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc)
