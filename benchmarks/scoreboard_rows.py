"""The rows of the committed fits as the scoreboard reads them (``benchmarks/seed_scoreboard.py``):
one :class:`Row` per line of a fit folder's ``rows.csv``, with what its measurement file declares
(the published ``system`` a policy stands in for), and when two rows compare policies on one setup.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
FITS = ROOT / "benchmarks" / "results" / "fits"
MEASUREMENTS = ROOT / "measurements"

PAIR_KEYS_IGNORED = {"policy", "policy.params", "pcie.sync_prefetch", "cache.swap_out", "cache.serial_swap"}
"""Keys that belong to the compared system, not to the setup: its policy and the policy's
parameters (accelerate's resident layers, which its placement rule derives from the GPU's memory),
fMoE's baselines' synchronous prefetch, and the copy-back of evicted experts that a system's own
code does (Mixtral-offloading's and AdapMoE's ``ExpertCache._swap``: fiddler-repo-baselines,
moe-infinity-readme, the MoEpic Mixtral rows), which its rivals on the same testbed do not."""
SELF_PLACING = {"accelerate"}
"""Policies whose GPU memory is set by their own placement rule rather than an expert-cache budget
(accelerate keeps whole decoder layers, as many as its rule fits: ``benchmarks/accelerate_placement.py``),
so a row of theirs is compared with the other systems' rows on the same GPU, model and workload
whatever its ``cache.*`` keys."""



def _number(text: str) -> float:
    """A predicted value of rows.csv: empty (no prediction) is NaN, ``inf`` stays infinite."""
    return float(text) if text.strip() else math.nan


def defined(x: float) -> bool:
    """A usable prediction: finite and positive."""
    return math.isfinite(x) and x > 0


def measured_apart(a: Row, b: Row) -> bool:
    """Whether two rows' measured values are more than 1% apart (closer, a pair orders nothing)."""
    return max(a.measured, b.measured) / min(a.measured, b.measured) - 1 > 0.01


def ordered_right(a: Row, b: Row) -> bool:
    """Whether the predictions order two rows as their measurements do: never with an undefined
    prediction, nor with two equal ones (a tie orders nothing)."""
    return (defined(a.predicted) and defined(b.predicted) and a.predicted != b.predicted
            and (a.measured > b.measured) == (a.predicted > b.predicted))


@dataclass
class Row:
    """One line of a fit's rows.csv."""

    stem: str
    index: int
    role: str
    metric: str
    measured: float
    predicted: float
    set: dict[str, Any]
    relative_to: dict[str, Any] | None
    groups: dict[str, str]
    named: str = "?"
    """What the row measured where its ``set`` names no policy: its declared ``system`` (the
    measurement file's or the row's), else the base's policy."""
    declared: str | None = None
    """Its declared ``system`` alone (None: none declared)."""

    @property
    def off(self) -> float:
        """max(predicted / measured, measured / predicted); infinite when the prediction is
        undefined (a miss, never dropped)."""
        if not defined(self.predicted):
            return math.inf
        return max(self.predicted / self.measured, self.measured / self.predicted)

    @property
    def abs_error(self) -> float:
        """|predicted / measured - 1|; infinite when the prediction is undefined."""
        return abs(self.predicted / self.measured - 1) if defined(self.predicted) else math.inf

    @property
    def policy(self) -> str:
        """The row's policy as a label (name and params)."""
        return _policy_label(self.set.get("policy", "?"))

    @property
    def policy_name(self) -> str:
        """The row's policy name."""
        p = self.set.get("policy", "?")
        return str(p["name"] if isinstance(p, dict) else p)

    @property
    def setup(self) -> str:
        """Everything but the policy: rows with the same setup compare policies."""
        return self._setup(PAIR_KEYS_IGNORED)

    @property
    def machine_setup(self) -> str:
        """The setup without the cache budget: what a row of a :data:`SELF_PLACING` policy shares
        with the rows it is compared to (its budget is its own placement's, not the setup's)."""
        return self._setup(PAIR_KEYS_IGNORED | {k for k in self.set if k.startswith("cache.")})

    def _setup(self, ignored: set[str]) -> str:
        s = {k: v for k, v in self.set.items() if k not in ignored}
        r = {k: v for k, v in (self.relative_to or {}).items() if k not in ignored}
        return json.dumps([self.metric, s, r], sort_keys=True)


def same_setup(a: Row, b: Row) -> bool:
    """Whether rows ``a`` and ``b`` compare policies on one setup: the same setup, or, when one
    of them runs a :data:`SELF_PLACING` policy, the same machine, model and workload."""
    if a.setup == b.setup:
        return True
    placing = SELF_PLACING & {a.policy_name, b.policy_name}
    return bool(placing) and a.machine_setup == b.machine_setup


def _policy_label(p: Any) -> str:
    if isinstance(p, dict):
        params = p.get("params") or {}
        return p["name"] + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
    return str(p)


def _named(stem: str) -> list[tuple[str | None, str]]:
    """Each row's declared system and its name for what it measured where its ``set`` names no
    policy (see :attr:`Row.named`)."""
    from moesim.sim.study.fit_spec import declared_systems

    path = MEASUREMENTS / f"{stem}.yaml"
    if not path.is_file():
        return []
    doc = yaml.safe_load(path.read_text()) or {}
    base = doc.get("base")
    policy = _policy_label(base.get("policy", "?")) if isinstance(base, dict) else "?"
    return [(system, system or policy) for system in declared_systems(doc)]


def load_rows(stem: str) -> list[Row]:
    """The rows of one fit folder."""
    out = []
    named = _named(stem)
    with open(FITS / stem / "rows.csv", newline="") as f:
        for r in csv.DictReader(f):
            i = int(r["row"])
            out.append(Row(stem=stem, index=i, role=r["role"], metric=r["metric"],
                           measured=float(r["measured"]), predicted=_number(r["predicted"]),
                           set=json.loads(r["set"]), relative_to=json.loads(r["relative_to"]) if r["relative_to"] else None,
                           groups=json.loads(r["groups"]) if r["groups"] else {},
                           declared=named[i][0] if i < len(named) else None,
                           named=named[i][1] if i < len(named) else "?"))
    return out
