"""The seed scoreboard (issue 21 item 4): each seed paper's own policy predicted as a held-out row
by a testbed fitted on that paper's baselines only, its published and predicted speed-up over
each baseline side by side, and the goals over every shipped measurement set.

    python benchmarks/seed_scoreboard.py                  # reads benchmarks/results/fits/*, ~1 min
    python benchmarks/seed_scoreboard.py --no-reasons     # skip the re-runs behind the reasons
    python benchmarks/seed_scoreboard.py --out benchmarks/results/seed_scoreboard.md

Input: the fits written by ``simctl fit measurements/<set>.yaml --out benchmarks/results/fits/<set>``
(``rows.csv``: measured and predicted value of every row; ``fitted.yaml``: the fitted values).
Nothing here is fitted: the script reads the fits' predictions and, for a speed-up that differs
from the published one by more than 1.5x, re-runs the two scenarios at the fitted values to
print the measured reason (hit rate, bytes moved per token, GPU busy fraction, stall).

Definitions:

- A **headline** is a row of the paper's own policy (its name in ``OWN``) that the fit never saw
  (role test), against each baseline row of the same set with the same metric and the same
  setup apart from the policy (of several such rows of one baseline, the nearest in the file:
  ActiveEvict's two datasets share a scenario). Speed-up = baseline time / own time, or own
  tokens/s / baseline tokens/s. A ratio row (``relative_to``) is itself the published speed-up
  (time ratios inverted; ActiveEvict's I/O ratios as reductions, hit rates as improvements).
- **Held-out error**: |predicted / measured - 1| over every test row of every fit folder. A row
  whose prediction is undefined (a ratio over a reference that the simulator puts at zero, empty
  or infinite in ``rows.csv``) is a miss: beyond 1.5x, and its error counts as infinite.
- **Ranking pairs**: two rows of one set, at least one held out, same metric, same setup apart
  from the policy (and a ratio row's reference policy; a self-placing policy's cache budget is its
  own, see ``scoreboard_rows.SELF_PLACING``), different policies, measured values more
  than 1% apart (the larger over the smaller, whichever row comes first); right when predicted and measured order agree (never with an undefined
  prediction, nor with two equal predictions: a tie orders nothing, and scoring it by which row
  comes first in the file would count it right or wrong by file order). **Held-out-only pairs** are those of two held-out rows: a fit row's prediction
  was fitted, so a pair with one is partly fitted.
- **System pairs**: two held-out rows of one set that measured different published systems
  (their declared ``system:``) on the same model and GPU (``benchmarks/system_pairs.py``): the
  order of systems a reader choosing one needs, which the ranking pairs (one setup, different
  policies) do not see.
- **Own policy fitted**: a set whose fit rows include the paper's own policy is listed as such;
  its headlines are not a prediction from baselines alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scoreboard_rows import (  # noqa: E402  (FITS, MEASUREMENTS, Row, load_rows: also read through here)
    FITS,
    MEASUREMENTS,
    Row,
    _policy_label,
    defined,
    load_rows,
    measured_apart,
    ordered_right,
    same_setup,
)
from benchmarks.system_pairs import system_pairs  # noqa: E402

OWN: dict[str, tuple[str, str]] = {
    # set stem: (paper, the paper's own policy)
    "moepic-mixtral": ("MoEpic (Mixtral, A6000)", "moepic"),
    "moepic-qwen": ("MoEpic (Qwen1.5-MoE, A6000)", "moepic"),
    "buddymoe-tables2-4": ("BuddyMoE (DeepSeek-V2-Lite, A100)", "buddymoe"),
    "activeevict-table3-mixtral": ("ActiveEvict (Mixtral, H20)", "activeevict"),
    "activeevict-table3-llama": ("ActiveEvict (LLaMA-MoE, H20)", "activeevict"),
    "commitmoe-fig5": ("CommitMoE (Fig. 5)", "commitmoe"),
    "fmoe-end-to-end": ("fMoE (Figs. 9, 11)", "fmoe"),
    "eliseev-mazur-2023-table2": ("Eliseev & Mazur (Table 2)", "mixtral-offloading"),
}
"""The seed papers with a measurement set, in scoreboard order."""

TIME = {"tpot_ms", "ttft_ms", "blocking_io_ms_per_token", "io_busy_ms_per_token", "h2d_gb_per_token"}
"""Metrics where less is better: a speed-up (or reduction) is baseline / own."""

REASONS = ("hit_rate", "late_rate", "partial_rate", "h2d_gb_per_token", "wasted_prefetch_gb", "gpu_busy_fraction",
           "stall_ms_per_token", "runtime_overhead_ms")
"""The measured quantities printed beside a speed-up that is off by more than 1.5x."""

VARIANTS = {"eliseev-mazur-2023-table2-one-runtime": ("eliseev-mazur-2023-table2",),
            "eliseev-mazur-2023-table2-miss-cost": ("eliseev-mazur-2023-table2",),
            "moepic-a6000-joint": ("moepic-mixtral", "moepic-qwen")}
"""Fits of the same rows under other free values (the sets whose rows they reuse): shown by set,
counted once in the goals."""

def speedup(metric: str, own: float, base: float) -> float:
    """Own over baseline as a speed-up (>1: the own policy is better)."""
    return base / own if metric in TIME else own / base


@dataclass
class Headline:
    """One published speed-up of a paper's own policy over one baseline, and its prediction."""

    stem: str
    own: Row
    baseline: str
    metric: str
    published: float
    predicted: float
    base_row: Row | None = None
    reason: list[str] = field(default_factory=list)

    @property
    def off(self) -> float:
        """How far the predicted speed-up is from the published one (>= 1; infinite when the
        prediction is undefined)."""
        if not defined(self.predicted):
            return math.inf
        r = self.predicted / self.published
        return max(r, 1 / r)


def headlines(stem: str, rows: list[Row]) -> list[Headline]:
    """The paper's headlines in one set (see the module docstring)."""
    own_name = OWN[stem][1]
    out = []
    for r in rows:
        if r.role != "test" or r.policy_name != own_name:
            continue
        if r.relative_to is not None:
            base = _policy_label(r.relative_to.get("policy", "?"))
            inv = 1 / r.predicted if defined(r.predicted) else math.nan
            pub, pred = (1 / r.measured, inv) if r.metric in TIME else (r.measured, r.predicted)
            out.append(Headline(stem, r, base, r.metric, pub, pred))
            continue
        nearest: dict[str, Row] = {}
        for b in rows:
            if b.relative_to is None and b.setup == r.setup and b.policy_name != own_name:
                cur = nearest.get(b.policy)
                if cur is None or abs(b.index - r.index) < abs(cur.index - r.index):
                    nearest[b.policy] = b
        for label, b in nearest.items():
            pred = (speedup(r.metric, r.predicted, b.predicted) if defined(r.predicted) and defined(b.predicted)
                    else math.nan)
            out.append(Headline(stem, r, label, r.metric, speedup(r.metric, r.measured, b.measured),
                                pred, base_row=b))
    return out


def ranking_pairs(rows: list[Row], held_out_only: bool = False) -> list[tuple[Row, Row, bool]]:
    """Every ranking pair of one set (see the module docstring) and whether it is right; with
    ``held_out_only``, the pairs of two held-out rows only."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if "test" not in (a.role, b.role) or not same_setup(a, b):
                continue
            if held_out_only and (a.role, b.role) != ("test", "test"):
                continue
            if a.policy == b.policy and json.dumps(a.relative_to, sort_keys=True) == json.dumps(b.relative_to, sort_keys=True):
                continue
            if measured_apart(a, b):
                out.append((a, b, ordered_right(a, b)))
    return out


def own_policy_fitted(stem: str, rows: list[Row]) -> list[Row]:
    """The fit rows of ``stem`` that run the paper's own policy (none for a baselines-only fit)."""
    own = OWN.get(stem, ("", ""))[1]
    base = next((k for s, ks in VARIANTS.items() if s == stem for k in ks), None)
    own = own or OWN.get(base or "", ("", ""))[1]
    return [r for r in rows if r.role == "fit" and own and r.policy_name == own]


def cache_start(stem: str) -> str:
    """How the rows of ``stem`` start their cache: ``cold (empty)`` or ``warm (popular, random)``,
    from each row's ``cache.initial`` (default empty)."""
    from moesim.sim.config.fitted import lookup
    from moesim.sim.study.fit_spec import load_measurements

    path = MEASUREMENTS / f"{stem}.yaml"
    if not path.is_file():
        return "?"
    starts = sorted({str(lookup(r.data, "cache.initial") or "empty") for r in load_measurements(path).rows})
    cold = [x for x in starts if x == "empty"]
    warm = [x for x in starts if x != "empty"]
    return ", ".join((["cold (empty)"] if cold else []) + ([f"warm ({', '.join(warm)})"] if warm else []))


def fitted_values(stem: str, row: Row) -> list[tuple[str, float]]:
    """The fitted values that applied to ``row`` in its fit."""
    doc = yaml.safe_load((FITS / stem / "fitted.yaml").read_text())
    return [(p["key"], float(p["value"])) for p in doc.get("parameters") or []
            if p.get("per") is None or row.groups.get(p["per"]) == p.get("group")]


def run_metrics(stem: str, row: Row, reference: bool = False) -> dict[str, Any]:
    """The metrics of ``row``'s scenario (or its ``relative_to`` reference) at the fitted values;
    of a ``mean_over`` row, the :data:`REASONS` averaged over its setups."""
    from moesim.sim.config.scenario import load_scenario_data, set_key
    from moesim.sim.run.runner import load_trace, run_loaded
    from moesim.sim.study.fit_spec import load_measurements

    ms = load_measurements(MEASUREMENTS / f"{stem}.yaml")
    spec = ms.rows[row.index]
    values = fitted_values(stem, row)
    runs = []
    for setup, (own, ref) in zip(spec.mean_over or [{}], spec.variants or [(spec.data, spec.reference)], strict=True):
        data = copy.deepcopy(ref if reference else own)
        fixed = (*spec.set, *setup, *spec.relative_to) if reference else (*spec.set, *setup)
        for key, value in values:
            set_key(data, key.split("."), value, f"{stem}: {key}")
        loaded = load_scenario_data(data, source=f"{stem} row {row.index}", base_dir=ms.base_dir,
                                    fixed=(*fixed, *(k for k, _ in values)))
        runs.append(run_loaded(loaded, steps=False, trace=load_trace(loaded)).metrics)
    if len(runs) == 1:
        metrics: dict[str, Any] = runs[0]
        return metrics
    return {k: sum(m[k] for m in runs) / len(runs) for k in REASONS
            if all(isinstance(m.get(k), (int, float)) for m in runs)}


def reason(h: Headline) -> list[str]:
    """The measured quantities of the own run and its baseline run, side by side."""
    own = run_metrics(h.stem, h.own)
    if h.base_row is not None:
        base = run_metrics(h.stem, h.base_row)
    else:
        base = run_metrics(h.stem, h.own, reference=True)
    lines = []
    for k in REASONS:
        a, b = own.get(k), base.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            lines.append(f"{k} {a:.3g} vs {b:.3g}")
    return ["own vs " + h.baseline + ": " + ", ".join(lines)]


def _fmt(x: float) -> str:
    return f"{x:.2f}x" if defined(x) else "undefined"


def scoreboard(reasons: bool) -> tuple[str, dict[str, Any]]:
    """The scoreboard and goals as Markdown, and the goal figures."""
    stems = sorted(p.name for p in FITS.iterdir() if (p / "rows.csv").exists())
    all_rows = {s: load_rows(s) for s in stems}
    lines = ["# Seed scoreboard", "",
             "Written by `python benchmarks/seed_scoreboard.py` from the fits in `benchmarks/results/fits/`",
             "(issue 21 item 4). Each testbed is fitted on the paper's baseline rows only; the paper's own",
             "policy is a held-out row. Speed-up: own over baseline (>1: own better); for I/O metrics the",
             "reduction factor, for hit rates the improvement. `off`: predicted / published, either way.", "",
             "| paper | set | own row | vs baseline | metric | published | predicted | off |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    heads: list[Headline] = []
    for stem in OWN:
        if stem not in all_rows:
            continue
        for h in headlines(stem, all_rows[stem]):
            heads.append(h)
            flag = " **>1.5x**" if h.off > 1.5 else ""
            lines.append(f"| {OWN[stem][0]} | {stem} | {h.own.index}: {h.own.policy} | {h.baseline} | {h.metric} "
                         f"| {_fmt(h.published)} | {_fmt(h.predicted)} | {_fmt(h.off)}{flag} |")
    far = [h for h in heads if h.off > 1.5]
    if far and reasons:
        lines += ["", "## Measured reasons (speed-ups off by more than 1.5x)", "",
                  "Both scenarios re-run at the fitted values; own vs baseline.", ""]
        for h in far:
            try:
                text = reason(h)
            except Exception as exc:   # a benchmark report: say why the reason is missing, go on
                text = [f"re-run failed: {' '.join(str(exc).split())}"]
            lines.append(f"- {h.stem} row {h.own.index} ({h.own.policy}) vs {h.baseline}, {h.metric}: "
                         f"published {_fmt(h.published)}, predicted {_fmt(h.predicted)}; " + "; ".join(text))
    sign = [h for h in heads if abs(h.published - 1) < 0.01
            or (defined(h.predicted) and (h.published > 1) == (h.predicted > 1))]
    within = [h for h in heads if h.off <= 1.5]

    counted = [s for s in stems if s not in VARIANTS]
    test = [r for s in counted for r in all_rows[s] if r.role == "test"]
    errs = [r.abs_error for r in test]
    beyond = [r for r in test if r.off > 1.5]
    undefined = [r for r in test if not defined(r.predicted)]
    pairs = [p for s in counted for p in ranking_pairs(all_rows[s])]
    right = sum(ok for _, _, ok in pairs)
    held_pairs = [p for s in counted for p in ranking_pairs(all_rows[s], held_out_only=True)]
    held_right = sum(ok for _, _, ok in held_pairs)
    sys_pairs = [p for s in counted for p in system_pairs(all_rows[s])]
    sys_right = sum(ok for _, _, ok in sys_pairs)
    own_fitted = {s: own_policy_fitted(s, all_rows[s]) for s in stems}
    goals = {
        "sets": len(counted), "held_out_rows": len(test),
        "median_abs_error_pct": 100 * statistics.median(errs) if errs else math.nan,
        "beyond_1_5x": len(beyond), "undefined": len(undefined), "pairs": len(pairs), "pairs_right": right,
        "held_out_pairs": len(held_pairs), "held_out_pairs_right": held_right,
        "system_pairs": len(sys_pairs), "system_pairs_right": sys_right,
        "headlines": len(heads), "sign_right": len(sign), "within_1_5x": len(within),
        "own_policy_fitted": sorted(s for s, rs in own_fitted.items() if rs),
    }
    lines += ["", "## Goals (issues 21 and 32)", "",
              "| goal | target | measured |", "| --- | --- | --- |",
              f"| held-out median abs error, {len(test)} rows of {len(counted)} sets | <= 10% | {goals['median_abs_error_pct']:.1f}% |",
              f"| held-out rows beyond 1.5x (an undefined prediction counts as one) | none | {len(beyond)}"
              f" ({len(undefined)} undefined) |",
              *_fitted_only(all_rows, counted),
              f"| ranking pairs right (at least one row held out) | >= 90% | {right} of {len(pairs)} "
              f"({100 * right / max(len(pairs), 1):.0f}%) |",
              f"| ranking pairs of two held-out rows right | >= 90% | {held_right} of {len(held_pairs)} "
              f"({100 * held_right / max(len(held_pairs), 1):.0f}%) |",
              f"| system pairs right (two held-out rows of different published systems, same model and GPU; "
              f"`benchmarks/system_pairs.py`) | >= 90% | {sys_right} of {len(sys_pairs)} "
              f"({100 * sys_right / max(len(sys_pairs), 1):.0f}%) |",
              f"| headlines right in sign | all | {len(sign)} of {len(heads)} |",
              f"| headlines within 1.5x of the published speed-up | all or explained | {len(within)} of {len(heads)} |",
              "", "### Sets that fit a paper's own policy", ""]
    fitted_own = [s for s in stems if own_fitted[s]]
    if fitted_own:
        lines += [f"- `{s}`: {len(own_fitted[s])} fit rows run the paper's own policy "
                  f"(`{own_fitted[s][0].policy_name}`; rows {', '.join(str(r.index) for r in own_fitted[s])}): "
                  "its headlines are not predicted from baselines alone." for s in fitted_own]
    else:
        lines += ["- none: every set fits baseline rows only (or nothing)."]
    lines += ["", "### Held-out error by set", "",
              *[f"- `{v}` fits the rows of {' and '.join(f'`{s}`' for s in k)} again with other free values: "
                "listed, not counted above." for v, k in VARIANTS.items()], "",
              "| set | held-out rows | median abs error | max ratio | beyond 1.5x | pairs right | held-out-only pairs right | cache start |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in stems:
        t = [r for r in all_rows[s] if r.role == "test"]
        if not t:
            continue
        e = [r.abs_error for r in t]
        mx = max(r.off for r in t)
        ps = ranking_pairs(all_rows[s])
        hp = ranking_pairs(all_rows[s], held_out_only=True)
        lines.append(f"| {s} | {len(t)} | {100 * statistics.median(e):.1f}% | {_fmt(mx)} | "
                     f"{sum(r.off > 1.5 for r in t)} | {sum(ok for _, _, ok in ps)} of {len(ps)} | "
                     f"{sum(ok for _, _, ok in hp)} of {len(hp)} | {cache_start(s)} |")
    wrong = [h for h in heads if h not in sign]
    if wrong:
        lines += ["", "Headlines with the wrong sign:", ""]
        lines += [f"- {h.stem} row {h.own.index} vs {h.baseline} ({h.metric}): published {_fmt(h.published)}, "
                  f"predicted {_fmt(h.predicted)}" for h in wrong]
    wrong_pairs = [(a, b) for a, b, ok in held_pairs if not ok]
    if wrong_pairs:
        lines += ["", "Held-out-only ranking pairs the prediction orders wrong (measured and predicted "
                  "ratio of the first row to the second; `tie`: equal predictions):", ""]
        lines += [f"- {a.stem} rows {a.index} ({_row_label(a)}) / {b.index} ({_row_label(b)}), {a.metric}: measured "
                  f"{a.measured:.4g} / {b.measured:.4g} = {a.measured / b.measured:.3f}, predicted "
                  + (_pair_ratio(a.predicted, b.predicted)) for a, b in wrong_pairs]
    if beyond:
        lines += ["", "Held-out rows beyond 1.5x:", ""]
        lines += [f"- {r.stem} row {r.index} ({_row_label(r)}, {r.metric}): measured {r.measured:.4g}, "
                  + (f"predicted {r.predicted:.4g} ({r.predicted / r.measured:.2f}x)" if defined(r.predicted)
                     else "no prediction (undefined: counted as a miss)") for r in beyond]
    return "\n".join(lines) + "\n", goals


def _row_label(r: Row) -> str:
    """A row's policy (what it measured, :attr:`Row.named`, where its ``set`` names none), and
    for a ratio row the reference policy it is over."""
    own = r.policy if "policy" in r.set else r.named
    if r.relative_to is None:
        return own
    return f"{own} over {_policy_label(r.relative_to.get('policy', '?'))}"


def _pair_ratio(a: float, b: float) -> str:
    """Two predictions of a wrong pair as text: their ratio, ``tie`` or ``undefined``."""
    if not (defined(a) and defined(b)):
        return "undefined"
    return f"{a:.4g} / {b:.4g} = " + ("tie" if a == b else f"{a / b:.3f}")


def _fitted_only(all_rows: dict[str, list[Row]], counted: list[str]) -> list[str]:
    """The two error goals again over the sets with fit rows only (a set with ``fit: {}`` is
    predicted with the catalog's spec sheets as they stand, nothing calibrated)."""
    stems = [s for s in counted if any(r.role == "fit" for r in all_rows[s])]
    test = [r for s in stems for r in all_rows[s] if r.role == "test"]
    if not test:
        return []
    errs = [r.abs_error for r in test]
    far = sum(r.off > 1.5 for r in test)
    return [f"| the same, the {len(stems)} sets with fit rows only ({len(test)} rows) | <= 10%, none beyond 1.5x "
            f"| {100 * statistics.median(errs):.1f}%, {far} beyond 1.5x |"]


def main() -> None:
    """Print the scoreboard (and write it with ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-reasons", action="store_true", help="skip the re-runs behind the >1.5x reasons")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args()
    text, _ = scoreboard(reasons=not args.no_reasons)
    sys.stdout.write(text)
    if args.out:
        from results_file import write_result  # this folder is on sys.path when run as a script

        write_result(args.out, text)


if __name__ == "__main__":
    main()
