"""Hypothesis profiles: ``ci`` (the default here) draws the same examples on every run, so a
submission is judged on a fixed sample; ``thorough`` draws many fresh ones, for hunting bugs:
``HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_engine_properties.py``."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
