"""The published statistics each synthetic preset is fitted to, and how close the preset comes.

Every preset of :data:`traces.synthetic.generator.PRESETS` shaped after a catalog model has a
targets file ``targets/<preset>.yaml`` next to this module (the format of
:mod:`traces.synthetic.fit_targets`: each target with its citation, how a published metric
was mapped onto moesim's statistic, and a tolerance). The preset's knobs come from
``simctl trace fit --preset NAME --targets FILE`` (``python benchmarks/fit_presets.py
--refit`` runs it for every preset); :func:`compare` measures a preset against its targets at
the preset's own workload and seed, which is also the workload the fit calibrates on, so the
achieved values printed by ``benchmarks/fit_presets.py`` and checked by
``tests/test_preset_targets.py`` are the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.sim.core.errors import MoesimError
from moesim.traces.analysis.recall import MEASURES
from moesim.traces.synthetic.fit import measure
from moesim.traces.synthetic.fit_targets import (
    TargetEntry,
    load_target_entries,
    lru_size,
    profile_values,
    top_size,
)
from moesim.traces.synthetic.generator import PRESETS, SynthParams, parse_params

TARGETS_DIR = Path(__file__).resolve().parent / "targets"
"""Folder of the targets files, one ``<preset>.yaml`` per fitted preset."""


def fitted_presets() -> list[str]:
    """Names of the presets that have a targets file, in :data:`PRESETS` order."""
    return [name for name in PRESETS if (TARGETS_DIR / f"{name}.yaml").is_file()]


def targets_path(preset: str) -> Path:
    """The targets file of ``preset`` (raises :class:`MoesimError` when it has none)."""
    path = TARGETS_DIR / f"{preset}.yaml"
    if not path.is_file():
        raise MoesimError(f"preset {preset!r} has no targets file (presets with one: {', '.join(fitted_presets())})")
    return path


def preset_targets(preset: str) -> dict[str, TargetEntry]:
    """The targets of ``preset``, statistic name -> :class:`TargetEntry`."""
    return load_target_entries(targets_path(preset))


@dataclass(frozen=True)
class Comparison:
    """One target against what a preset gives: ``achieved`` (for a per-layer ``reuse``
    profile: the mean over layers, with ``error`` the largest per-layer difference), the
    absolute ``error`` and whether it is within the entry's tolerance."""

    statistic: str
    target: float
    achieved: float | None
    error: float | None
    entry: TargetEntry

    @property
    def met(self) -> bool:
        """Whether the achieved value is within the target's tolerance."""
        return self.error is not None and self.error <= self.entry.tolerance + 1e-12


def compare(params: SynthParams, entries: dict[str, TargetEntry]) -> list[Comparison]:
    """Measure ``params`` (generated in memory; prediction recall with the default 70 %
    profile split, LRU over every token) and compare it with each target of ``entries``."""
    sizes = sorted(s for name in entries if (s := lru_size(name)) is not None)
    tops = sorted(s for name in entries if (s := top_size(name)) is not None)
    got = measure(params, recall=any(name in MEASURES for name in entries), lru_sizes=sizes, top_sizes=tops)
    out = []
    for name, entry in entries.items():
        if name == "reuse":
            L = len(got.reuse)
            want = np.asarray(profile_values(entry.value if isinstance(entry.value, tuple) else (entry.value,), L))
            err = float(np.abs(got.reuse - want).max())
            out.append(Comparison(name, float(want.mean()), float(got.reuse.mean()), err, entry))
            continue
        assert not isinstance(entry.value, tuple)  # parse_target_entries allows lists for reuse only
        v = got.value(name)
        out.append(Comparison(name, float(entry.value), v, None if v is None else abs(v - float(entry.value)), entry))
    return out


def compare_preset(preset: str, **overrides: object) -> list[Comparison]:
    """:func:`compare` of preset ``preset`` (with ``overrides``, e.g. another seed) against its
    targets file."""
    return compare(parse_params({"preset": preset, **overrides}), preset_targets(preset))
