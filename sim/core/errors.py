"""The one exception family that the CLI turns into a single-line error and exit status 2."""

from __future__ import annotations


class MoesimError(Exception):
    """A user-facing error: bad input, unknown names, impossible values, missing files.

    ``str(err)`` must be one line that names the culprit (file, row, column, YAML path...).
    """
