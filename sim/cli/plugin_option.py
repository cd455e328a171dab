"""``--allow-plugins``: the option of every command that reads scenarios, the user's word that
the Python files a scenario lists under ``plugins:`` may run (:mod:`moesim.policies.contract.plugins`)."""

from __future__ import annotations

import typer

ALLOW_PLUGINS = typer.Option(
    "--allow-plugins",
    help="run the Python files the scenario lists under plugins: (code, with your rights); "
         "or set MOESIM_ALLOW_PLUGINS=1")


def grant_plugins(allow: bool) -> None:
    """With ``--allow-plugins``, allow plugin code for this command and the workers it starts."""
    if allow:
        from moesim.policies.contract.plugins import allow_plugins

        allow_plugins()
