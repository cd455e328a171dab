"""Hypothesis profiles: ``ci`` (the default here) draws the same examples on every run, so a
submission is judged on a fixed sample; ``thorough`` draws many fresh ones, for hunting bugs:
``HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_engine_properties.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _plugins_stay_in_their_module() -> Iterator[None]:
    """A plugin loaded by one test module (its policies registered, its file marked loaded) is
    forgotten when the module ends, so that `policy: all` elsewhere sees the built-ins alone."""
    from moesim.policies.contract import plugins, registry

    registry.load_builtin_policies()
    names, loaded = dict(registry._REGISTRY), dict(plugins._LOADED)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(names)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)
