"""``simctl trace ...``: import, synthesise, record and inspect moe-trace files."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
