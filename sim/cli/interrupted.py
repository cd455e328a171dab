"""What an interrupted study (``sweep``, ``compare``) says: that it was interrupted, how many
points it kept, and the exact command that resumes it (finished points are never run again)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from moesim.sim.core.atomic import Terminated
from moesim.sim.core.escape import visible

_OUT = ("--out", "-o")
_DROP = ("--force",)   # a resume with --force would clear the kept points


def resume_command(argv: list[str] | None, out: Path) -> str:
    """The command line ``argv`` (as typed, starting with ``simctl``) that resumes a study in
    ``out``: ``--force`` left out, ``--out`` naming ``out`` (a default folder may have been a
    timestamped one)."""
    args = list(argv or ["simctl"])
    kept: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _DROP:
            i += 1
            continue
        if a in _OUT:
            i += 2
            continue
        if a.startswith("--out="):
            i += 1
            continue
        kept.append(a)
        i += 1
    return shlex.join([*kept, "--out", str(out)])


@contextmanager
def resumable(argv: list[str] | None, out: Path, progress: Callable[[], tuple[int, int]]) -> Iterator[None]:
    """Within the block, Ctrl-C (exit 130) or SIGTERM (exit 143) ends the command with one line:
    what stopped it, ``progress()`` (points kept, points in all) and the command that resumes."""
    try:
        yield
    except (KeyboardInterrupt, Terminated) as exc:
        what, code = ("Ctrl-C", 130) if isinstance(exc, KeyboardInterrupt) else ("SIGTERM", 143)
        done, total = progress()
        typer.echo(f"simctl: interrupted ({what}) with {done} of {total} points done and kept in {visible(out)}; "
                   f"resume with: {visible(resume_command(argv, out))}", err=True)
        raise typer.Exit(code) from None
