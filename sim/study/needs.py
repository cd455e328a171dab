"""Policies' setup needs applied to a study's points: each policy runs as its paper meant it, or
the point is ``n/a`` with the reason.

A study (a sweep, ``simctl compare``) groups its points by everything but the policy: one
group is one scenario on which policies are compared. For each group, before anything runs:

1. a point whose policy needs a trace column the trace lacks, or ``cache.swap_out`` that the
   scenario does not give, is ``n/a`` (the policy would fall back to another method; swap-out
   is a property of the system studied, not a default to slip under one policy);
2. when a remaining policy needs a profile split and the scenario gives none, the largest
   share any of them asks for is split off the front of the trace for *every* point of the
   group, so that all policies still replay the same requests (a policy that reads no profile
   is unaffected by it otherwise); a trace too short for it makes those policies ``n/a``;
3. a point whose policy needs a run of at least N routed tokens (MoEpic's configurator
   window ``tau``) on a workload that routes fewer is ``n/a``;
4. when a remaining policy needs a transfer buffer and the scenario leaves
   ``cache.buffer_experts`` unset, the largest asked for is given to every point of the group
   (the buffer is room every policy may use, as the scenario schema says).

Anything the scenario sets explicitly (in its file, ``set:``, ``--set`` or a swept key) is
kept as it is: a run that then falls back says so in its warnings. Each point keeps the
notes of what was applied (``applied``) and why it cannot run (``unmet``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from moesim.policies.contract.base import OPTIONAL_COLUMNS
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, TOP_K, SetupNeeds
from moesim.sim.core.errors import MoesimError

if TYPE_CHECKING:  # pragma: no cover
    from moesim.policies.contract.base import Policy
    from moesim.sim.config.scenario import LoadedScenario
    from moesim.traces.format.trace_file import Trace

_PHASE_NAMES = ("prefill", "decode")


@dataclass
class TraceFacts:
    """What a trace offers to policies: its optional columns, its requests in order and each
    request's tokens per phase (the counts a workload selection routes)."""

    name: str
    columns: frozenset[str]
    top_k: int
    requests: list[int]
    tokens: dict[int, dict[str, int]]

    def routed_tokens(self, requests: Sequence[int], phases: Sequence[str]) -> int:
        """Tokens the replay of ``requests`` routes, counting the ``phases`` replayed."""
        return sum(self.tokens[r].get(p, 0) for r in requests for p in phases)


@dataclass
class PointFit:
    """One point after its policy's needs were weighed: the scenario data to run (defaults
    applied), what was applied (notes for the outputs), why it cannot run (``unmet``, or
    None) and its policy's kind (``lossless``, ``lossy``, ``oracle``)."""

    data: dict[str, Any]
    applied: list[str] = field(default_factory=list)
    unmet: str | None = None
    kind: str = "lossless"


def _present_file_columns(path: Any) -> frozenset[str]:
    """Optional columns of a trace file holding values (a column of nulls counts as absent, as
    when the trace is read; the first rows decide, a partly filled column being invalid)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = [c for c in OPTIONAL_COLUMNS if c in pf.schema_arrow.names]
    if not names or pf.metadata.num_rows == 0:
        return frozenset()
    batch = next(pf.iter_batches(batch_size=64, columns=names))
    return frozenset(c for c in names if batch.column(c).null_count < batch.num_rows)


def trace_facts(loaded: LoadedScenario) -> TraceFacts:
    """The :class:`TraceFacts` of a scenario's trace (a file is read without its optional
    columns; a synthetic trace is generated)."""
    from moesim.sim.run.runner import load_trace

    path = loaded.trace_path()
    if path is not None:
        trace: Trace = load_trace(loaded, frozenset())
        columns = _present_file_columns(path)
    else:
        trace = load_trace(loaded)
        columns = frozenset(c for c in OPTIONAL_COLUMNS if getattr(trace, c, None) is not None)
    L = trace.model.num_layers
    rows0 = np.arange(0, trace.num_rows, L)
    req = trace.request_id[rows0].astype(np.int64)
    phase = trace.phase[rows0].astype(np.int64)
    order = list(dict.fromkeys(int(r) for r in req))
    tokens: dict[int, dict[str, int]] = {r: {} for r in order}
    for (r, ph), n in zip(*np.unique(np.stack([req, phase], axis=1), axis=0, return_counts=True), strict=True):
        tokens[int(r)][_PHASE_NAMES[int(ph)]] = int(n)
    return TraceFacts(name=trace.model.name, columns=columns, top_k=int(trace.model.top_k),
                      requests=order, tokens=tokens)


def _facts_key(loaded: LoadedScenario) -> str:
    path = loaded.trace_path()
    return str(path.resolve()) if path is not None else json.dumps(loaded.scenario.trace, sort_keys=True)


def missing_columns_reason(needs: SetupNeeds, facts: TraceFacts) -> str | None:
    """Why the trace cannot serve the policy's columns, or None."""
    missing = sorted(needs.columns - facts.columns)
    if not missing:
        return None
    which = f"column {missing[0]}, which" if len(missing) == 1 else f"columns {', '.join(missing)}, which"
    return f"needs trace {which} the trace ({facts.name}) lacks"


def _replayed(loaded: LoadedScenario, facts: TraceFacts, profile: int | None) -> list[int]:
    """The requests the workload replays with ``profile`` requests split off the front."""
    spec = loaded.scenario.workload.requests
    remaining = facts.requests[profile:] if profile else list(facts.requests)
    if spec == "all":
        return remaining
    if isinstance(spec, int):
        return remaining[:spec]
    return [int(r) for r in spec]


def profile_size(loaded: LoadedScenario, facts: TraceFacts, share: float) -> tuple[int | None, str]:
    """Requests to split off for a profile of ``share`` of the trace, leaving what the
    workload asks for; (None, why) when none can be."""
    n = len(facts.requests)
    want = max(1, round(share * n))
    spec = loaded.scenario.workload.requests
    if spec == "all":
        room = n - 1
    elif isinstance(spec, int):
        room = n - spec
    else:
        listed = {int(r) for r in spec}
        room = next((i for i, r in enumerate(facts.requests) if r in listed), n)
    size = min(want, room)
    if size < 1:
        return None, (f"needs a profile: split, but the trace's {n} request(s) leave none to profile "
                      "beside the ones the workload replays")
    return size, ""


def profile_note(size: int, n: int, share: float, who: str, why: str, replayed: int) -> str:
    """The applied note of a profile split: the share applied (``size`` of ``n`` requests), and
    the share asked for when whole requests or the workload made it another."""
    note = f"profile.requests={size} ({size / n:.0%} of the trace's {n} requests, for {who}: {why}"
    if abs(size - share * n) > 1e-9:
        why_not = ("the workload's requests come first" if size < max(1, round(share * n))
                   else "whole requests")
        note += f"; {share:.0%} asked, {share * n:g} requests, made {size} ({why_not})"
    return note + f"; every policy replays the same {replayed})"


def _who(names: list[str]) -> str:
    names = list(dict.fromkeys(names))
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for k in parents:
        node = node.setdefault(k, {})
    node[last] = value


def _own_profile(loaded: LoadedScenario) -> int | None:
    """Requests the scenario's own profile split takes off the front of its trace (None: no
    split, or one from another file)."""
    prof = loaded.scenario.profile
    return prof.requests if prof is not None and prof.trace is None else None


def fit_group(items: Sequence[tuple[dict[str, Any], LoadedScenario, Policy]], facts: TraceFacts | None) -> list[PointFit]:
    """Weigh the needs of one group's policies (points alike but for the policy) against their
    scenario and trace (see the module docstring). ``facts`` None (a trace that cannot be read
    here): nothing is applied; the points fail or warn on their own."""
    fits = [PointFit(data=copy.deepcopy(data), kind=pol.kind()) for data, _, pol in items]
    if facts is None or not items:
        return fits
    needs = [pol.needs() for _, _, pol in items]
    names = [pol.name for _, _, pol in items]
    for fit, need, (_, loaded, _) in zip(fits, needs, items, strict=True):
        reasons = [r for r in (missing_columns_reason(need, facts),) if r]
        if need.swap_out and not loaded.scenario.cache.swap_out:
            reasons.append("needs cache.swap_out: true (its mechanism hides the copies of evicted experts "
                           "back to the host; in this scenario evictions are free)")
        fit.unmet = "; ".join(reasons) or None
    n = len(items)
    profile = [_own_profile(loaded) for _, loaded, _ in items]
    # 2. one profile split for every point that has none of its own
    open_profile = [i for i in range(n) if items[i][1].scenario.profile is None]
    wanting = [i for i in open_profile if fits[i].unmet is None and needs[i].profile_share is not None]
    if wanting:
        top = max(wanting, key=lambda i: float(needs[i].profile_share or 0))
        share = float(needs[top].profile_share or 0)
        for i in open_profile:
            size, why = profile_size(items[i][1], facts, share)
            if size is None:
                if i in wanting:
                    fits[i].unmet = why
                continue
            profile[i] = size
            _set(fits[i].data, "profile", {"requests": size})
            why_share = ("moesim's share where the papers name none" if share == DEFAULT_PROFILE_SHARE
                         else needs[top].source or names[top])
            replayed = len(_replayed(items[i][1], facts, size))
            fits[i].applied.append(profile_note(size, len(facts.requests), share, _who([names[j] for j in wanting]),
                                                why_share, replayed))
    # 3. runs too short for a periodic step
    for i, (_, loaded, _) in enumerate(items):
        need = needs[i]
        if fits[i].unmet is not None or need.min_tokens is None:
            continue
        routed = facts.routed_tokens(_replayed(loaded, facts, profile[i]), loaded.scenario.workload.phases)
        if routed < need.min_tokens:
            param = need.min_tokens_param or "the period"
            fits[i].unmet = (f"needs a run of at least {need.min_tokens} routed tokens ({param}); this workload "
                             f"routes {routed}: replay more tokens or lower policy.params.{param}")
    # 4. one transfer buffer for every point that sets none
    open_buffer = [i for i in range(n) if "buffer_experts" not in (items[i][0].get("cache") or {})]
    wanting = [i for i in open_buffer if fits[i].unmet is None and needs[i].buffer_experts is not None]
    if wanting:
        top = max(wanting, key=lambda i: needs[i].buffer_size(facts.top_k))
        size_f = needs[top].buffer_size(facts.top_k)
        value: float | int = int(size_f) if size_f.is_integer() else size_f
        what = f"top_k = {facts.top_k}" if needs[top].buffer_experts == TOP_K else f"{value:g} experts"
        note = (f"cache.buffer_experts={value} ({what}, for {_who([names[j] for j in wanting])}: "
                f"{needs[top].source or names[top]}; room every policy of the comparison may use)")
        for i in open_buffer:
            _set(fits[i].data, "cache.buffer_experts", value)
            fits[i].applied.append(note)
    for fit in fits:
        if fit.unmet is not None:
            fit.applied = []
    return fits


def fit_points(items: Sequence[tuple[dict[str, Any], LoadedScenario, Policy]],
               groups: Sequence[Hashable]) -> list[PointFit]:
    """:func:`fit_group` for every group of a study (``groups[i]`` is point ``i``'s group:
    its swept values other than the policy), in the points' order."""
    cache: dict[str, TraceFacts | None] = {}
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    out: list[PointFit | None] = [None] * len(items)
    for members in by_group.values():
        group = [items[i] for i in members]
        if all(pol.needs().empty for _, _, pol in group):   # nothing to weigh: no trace to read
            for i, (data, _, pol) in zip(members, group, strict=True):
                out[i] = PointFit(data=copy.deepcopy(data), kind=pol.kind())
            continue
        loaded = group[0][1]
        key = _facts_key(loaded)
        if key not in cache:
            try:
                cache[key] = trace_facts(loaded)
            except (MoesimError, OSError):  # the points will report it themselves, one line each
                cache[key] = None
        for i, fit in zip(members, fit_group(group, cache[key]), strict=True):
            out[i] = fit
    return [f for f in out if f is not None]
