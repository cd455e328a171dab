"""``simctl``: the command-line interface of moesim.

Every user error (a :class:`sim.errors.MoesimError`, a missing file, a bad option) ends in one
line on stderr and exit status 2; never a traceback.
"""

from __future__ import annotations

import sys

import typer

from sim.errors import MoesimError
from traces.cli import app as trace_app

app = typer.Typer(
    name="simctl",
    help="moesim: trace-driven simulator of MoE inference with expert offloading.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(trace_app, name="trace", help="Record, import, synthesise and inspect moe-trace files.")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``simctl`` console script."""
    try:
        rv = app(args=argv, prog_name="simctl", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        print("simctl: aborted", file=sys.stderr)
        return 130
    except MoesimError as exc:
        print(f"simctl: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"simctl: error: {exc.filename or exc}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # click's usage errors (typer vendors its own click in recent releases, so match by shape)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            if type(exc).__name__ == "NoArgsIsHelpError":
                print(exc.ctx.get_help())  # type: ignore[attr-defined]
                return 0
            msg = " ".join(str(exc.format_message()).split())
            print(f"simctl: error: {msg}", file=sys.stderr)
            return int(exc.exit_code)
        raise
    return int(rv) if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
