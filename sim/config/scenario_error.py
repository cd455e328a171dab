"""The error of a scenario that cannot run (its own module, so that the scenario's parts below
:mod:`moesim.sim.config.scenario` can raise it)."""

from __future__ import annotations

from moesim.sim.core.errors import MoesimError


class ScenarioError(MoesimError, ValueError):
    """A scenario that cannot run; the message names the file and the YAML path."""
