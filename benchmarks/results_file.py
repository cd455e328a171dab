"""Writing a benchmark's results file: whole (a temporary sibling renamed into place), and only
inside this folder's ``results/``, which the benchmark scripts own (``--out`` elsewhere is
refused as any moesim output is: :func:`moesim.sim.core.atomic.atomic_file`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""The folder of the committed benchmark results."""


def write_result(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename; a file under :data:`RESULTS` counts as the
    scripts' own, any other is replaced only if moesim wrote it."""
    from moesim.sim.core.atomic import atomic_file

    with atomic_file(path, option="--out", force=True, owned=lambda p: p.resolve().is_relative_to(RESULTS)) as tmp:
        tmp.write_text(text)


def report_main(report: Callable[[], str], description: str, argv: list[str] | None = None) -> int:
    """The command line of a report script with no option but ``--out``: print ``report()``'s
    Markdown, and write it to ``--out`` too (:func:`write_result`)."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args(argv)
    text = report()
    print(text)
    if args.out:
        write_result(args.out, text)
    return 0
