"""Output files and folders that appear whole or not at all.

Every command that writes (``run --out``, ``calibrate -o``, ``trace synth/import/record -o``,
``validate --out``) writes into a hidden temporary sibling named ``.NAME.moesim-tmp-PID`` and
renames it into place at the end, so a failure or a kill never leaves a half-written output
under the name the user gave. A later write to the same name removes such leftovers whose
process is gone. Every output folder carries moesim's marker (:mod:`moesim.sim.core.ownership`).
An existing non-empty output is refused unless ``force`` (``--force``) and moesim wrote it, and
then replaced by :func:`replace_folder` (folders: rename aside, rename in, delete the old one)
or one rename (files); the root, home and working folders are never touched. While a temporary sibling exists, SIGTERM unwinds the process as
Ctrl-C does (:func:`terminate_cleanly`), so ``kill PID`` removes it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from moesim.sim.core.errors import MoesimError
from moesim.sim.core.ownership import (
    MARKER,
    is_empty_folder,
    legacy_kind,
    owned_file,
    owned_folder,
    protected_reason,
    read_marker,
    write_marker,
)

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


def check_target(path: Path, *, option: str, folder: bool, force: bool = False,
                 owned: Callable[[Path], bool] | None = None) -> None:
    """Refuse, before any work, an output that cannot be written: a name that is not UTF-8
    (Parquet and JSON cannot hold it), a place moesim never writes
    (:func:`moesim.sim.core.ownership.protected_reason`), a symbolic link, a parent that is a
    file, a folder where a file goes (or the reverse), an existing output that moesim did not
    write (even with ``force``: :mod:`moesim.sim.core.ownership`) or that it wrote, without
    ``force``, a place without write permission. ``owned`` recognises more files as moesim's
    (a command's own kind of output that carries no signature). Writes nothing."""
    path = Path(path)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise OutputError(f"{option} {shown}: the name is not UTF-8 text (character {exc.start + 1}); "
                          "give a UTF-8 name") from None
    why = protected_reason(path)
    if why is not None:
        raise OutputError(f"{option} {path}: is {why}; moesim never writes into it nor replaces it: "
                          "give a new folder for the output")
    for anc in reversed(path.parents):
        if anc.exists() and not anc.is_dir():
            raise OutputError(f"{option} {path}: {anc} is a file, not a folder")
    if path.is_symlink():
        raise OutputError(f"{option} {path}: is a symbolic link; give the place it points to, or a new name")
    if path.exists():
        if folder and not path.is_dir():
            raise OutputError(f"{option} {path}: exists and is a file, not a folder")
        if not folder and path.is_dir():
            raise OutputError(f"{option} {path}: is a folder; give a file name")
        if folder:
            _check_folder(path, option, force)
        elif not (owned_file(path) or (owned is not None and owned(path))):
            raise OutputError(f"{option} {path}: the file exists and moesim did not write it; moesim never "
                              "replaces it: give a new file name")
        elif not force:
            raise OutputError(f"{option} {path}: the file exists; add --force to replace it")
    base = _nearest_existing(path.parent)
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot write in {base} (permission denied)")


def _check_folder(path: Path, option: str, force: bool) -> None:
    if is_empty_folder(path):
        return
    if read_marker(path) is None:
        kind = legacy_kind(path)
        if kind is not None:
            raise OutputError(f"{option} {path}: holds a moesim {kind} output from before moesim marked its "
                              f"folders ({MARKER}); move it away or delete it yourself, or give a new folder")
        raise OutputError(f"{option} {path}: the folder holds files moesim did not write; moesim never "
                          "replaces it: give a new or empty folder")
    if not force:
        raise OutputError(f"{option} {path}: the folder exists and holds a moesim output; add --force to replace it")


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
            remove_temporary(p)


def _mkparent(path: Path, option: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot create the folder ({_reason(exc)})") from None


def remove_temporary(path: Path) -> None:
    """Remove a temporary sibling that moesim made (a folder, a file, or a link: never what a
    link points to)."""
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(OSError):
            path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def new_folder(out: Path, *, option: str, kind: str, **extra: Any) -> Path:
    """A fresh temporary sibling of ``out`` (``.NAME.moesim-tmp-PID``) carrying the marker of
    ``kind`` (and ``extra``), to fill and then move into place with :func:`replace_folder`."""
    _mkparent(out, option)
    clean_stale(out)
    tmp = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}"
    remove_temporary(tmp)
    try:
        tmp.mkdir()
        write_marker(tmp, kind, **extra)
    except OSError as exc:
        remove_temporary(tmp)
        raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
    return tmp


def replace_folder(out: Path, new: Path, *, option: str) -> None:
    """Move the folder ``new`` into place as ``out``: the one way moesim replaces an output
    folder. An existing ``out`` must be moesim's (carrying the marker, or empty: checked again
    here, just before it goes); it is renamed aside to ``.NAME.moesim-tmp-PID-old``, ``new``
    renamed to ``out``, and only then the old one deleted (so a failure in between leaves one
    of the two under the name)."""
    if out.is_symlink() or (out.exists() and not owned_folder(out)):
        raise OutputError(f"{option} {out}: changed meanwhile and now holds files moesim did not write; "
                          "moesim never replaces it")
    old = out.parent / f".{out.name}{TMP_TAG}{os.getpid()}-old"
    remove_temporary(old)
    if out.exists():
        out.rename(old)
    try:
        new.rename(out)
    except OSError:
        if old.exists() and not out.exists():
            old.rename(out)   # put the old output back
        raise
    remove_temporary(old)


@contextlib.contextmanager
def atomic_folder(path: str | Path, *, option: str = "--out", force: bool = False,
                  kind: str = "output") -> Iterator[Path]:
    """Yield a temporary folder (carrying the marker of ``kind``) to fill; on success it becomes
    ``path`` (replacing an old one only with ``force``, and only one moesim wrote:
    :func:`check_target`); on any failure it is removed and ``path`` is untouched."""
    out = Path(path)
    check_target(out, option=option, folder=True, force=force)
    with terminate_cleanly():
        tmp = new_folder(out, option=option, kind=kind)
        try:
            yield tmp
            check_target(out, option=option, folder=True, force=force)   # nothing new there meanwhile
            replace_folder(out, tmp, option=option)
        except OSError as exc:
            raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
        finally:
            remove_temporary(tmp)


def check_own_folder(path: Path, *, option: str = "--out", accept: tuple[str, ...] | None = None) -> bool:
    """Check, writing nothing, that :func:`own_folder` will take ``path``; True when it is a
    folder of moesim's already (else it is new or empty)."""
    out = Path(path)
    if out.is_dir() and not out.is_symlink() and not is_empty_folder(out):
        check_target(out, option=option, folder=True, force=True)
        held = str((read_marker(out) or {}).get("kind", "output"))
        if accept is not None and held not in accept:
            raise OutputError(f"{option} {out}: holds another moesim output ({held}); give another {option}")
        return True
    check_target(out, option=option, folder=True)
    return False


def own_folder(path: str | Path, *, option: str = "--out", kind: str, accept: tuple[str, ...] | None = None) -> Path:
    """Make ``path`` a folder that moesim adds its files to (a report, an advice, figures beside
    a run): created with the marker of ``kind`` when it is new or empty; accepted when it
    carries the marker (of a kind in ``accept``, when given); refused otherwise (the user's
    folder, an output from before the marker). Each file is then written with
    :func:`atomic_file`."""
    out = Path(path)
    if check_own_folder(out, option=option, accept=accept):
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, kind)
    except OSError as exc:
        raise OutputError(f"{option} {out}: cannot write ({_reason(exc)})") from None
    return out


@contextlib.contextmanager
def atomic_file(path: str | Path, *, option: str = "-o", force: bool = False,
                owned: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a temporary file path (same folder and suffix) to write; on success it replaces
    ``path`` in one rename (an existing file only with ``force`` and only one moesim wrote:
    :func:`check_target`); on any failure it is removed and ``path`` is untouched."""
    out = Path(path)
    check_target(out, option=option, folder=False, force=force, owned=owned)
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
