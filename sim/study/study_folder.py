"""A study's output folder (``sweep``, ``compare``, ``advise``): new, resumed, or replaced.

A study folder carries moesim's marker (:mod:`moesim.sim.core.ownership`) with the study's key
(:func:`study_key`: a hash of its points' config hashes) and name. Given again, a folder is:

- resumed when its marker has this study's key (the points already there are kept);
- refused when its marker has another study's key, unless ``force``;
- refused, even with ``force``, when it has no marker and holds anything: files moesim did not
  write, or a study from before the marker (then the line says to move it away);
- replaced (``force``) through :func:`moesim.sim.core.atomic.replace_folder`, the one path that
  replaces an output folder.

While a study runs, its folder is locked (:class:`moesim.sim.core.folder_lock.FolderLock`): a
second study on the same folder is refused with one line.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from moesim.sim.core.atomic import (
    OutputError,
    check_target,
    new_folder,
    remove_temporary,
    replace_folder,
)
from moesim.sim.core.folder_lock import FolderLock
from moesim.sim.core.ownership import is_empty_folder, read_marker, write_marker

if TYPE_CHECKING:  # pragma: no cover
    from moesim.sim.study.sweep import Sweep

KIND = "study"
"""The marker's kind for a study folder."""


def study_key(sweep: Sweep) -> str:
    """What makes two studies the same: a hash of their points' config hashes, in order."""
    return hashlib.sha256("\n".join(p.config_hash for p in sweep.points).encode()).hexdigest()[:16]


def same_study(folder: Path, sweep: Sweep) -> bool:
    """True when ``folder`` carries the marker of this very study (it may be resumed)."""
    marker = read_marker(folder)
    return marker is not None and marker.get("study") == study_key(sweep)


def check_study_out(out: Path, sweep: Sweep, *, force: bool = False, option: str = "--out") -> str:
    """How :func:`study_folder` will use ``out``: ``new`` (absent or empty), ``resume`` (this
    study's folder) or ``replace`` (another moesim output, with ``force``). Anything else is
    refused with one line. Writes nothing."""
    out = Path(out)
    if out.is_dir() and not out.is_symlink() and not is_empty_folder(out):
        marker = read_marker(out)
        if marker is not None and not force:
            if marker.get("study") == study_key(sweep):
                check_target(out, option=option, folder=True, force=True)   # the root, home, permissions
                return "resume"
            what = f"another study ({marker['name']})" if isinstance(marker.get("name"), str) else "another output"
            check_target(out, option=option, folder=True, force=True)
            raise OutputError(f"{option} {out}: holds {what}; give another {option}, or add --force to replace it")
        check_target(out, option=option, folder=True, force=force)
        return "replace"
    check_target(out, option=option, folder=True, force=force)
    return "new"


@contextlib.contextmanager
def study_folder(out: Path, sweep: Sweep, *, force: bool = False, option: str = "--out") -> Iterator[Path]:
    """The study's folder, checked (:func:`check_study_out`), created or replaced, carrying the
    marker, and locked for the block."""
    out = Path(out)
    how = check_study_out(out, sweep, force=force, option=option)
    if how == "resume":
        lock = FolderLock(out, option=option)
    elif how == "new" and out.is_dir():   # an empty folder (perhaps a mount point): marked where it is
        lock = FolderLock(out, option=option)
        try:
            write_marker(out, KIND, study=study_key(sweep), name=sweep.spec.name)
        except OSError as exc:
            lock.release()
            raise OutputError(f"{option} {out}: cannot write ({exc.strerror or exc})") from None
    else:
        old = FolderLock(out, option=option) if out.is_dir() else None   # nobody writes the old one now
        try:
            tmp = new_folder(out, option=option, kind=KIND, study=study_key(sweep), name=sweep.spec.name)
            try:
                lock = FolderLock(tmp, option=option, shown=out)
                try:
                    replace_folder(out, tmp, option=option)
                except OSError as exc:
                    lock.release()
                    raise OutputError(f"{option} {out}: cannot write ({exc.strerror or exc})") from None
            finally:
                remove_temporary(tmp)   # gone already when it was moved into place
        finally:
            if old is not None:
                old.release()
    try:
        yield out
    finally:
        lock.release()
