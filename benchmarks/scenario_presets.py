"""The paper-reproduction scenarios on the fitted routing presets beside the legacy ones (issue 32):
each shipped scenario whose synthetic trace names a fitted preset (``<model>``), run as committed
and again with the preset swapped for ``<model>-legacy`` (the routing the scenario ran before),
printing hit rate, tokens/s and TPOT side by side.

    python benchmarks/scenario_presets.py                                          # ~1 min on 2 cores
    python benchmarks/scenario_presets.py --out benchmarks/results/fitted_scenarios.md

The MoEpic Qwen1.5-MoE scenarios ran the legacy preset with ``popularity_skew`` 0.1,
``token_locality`` 0.05 and ``topic_strength`` 0.15 set by hand (so that LRU's hit rates met
MoEpic's Table 1); they now run the fitted preset alone, so their legacy column puts those three
knobs back: it is the trace they ran.
"""

from __future__ import annotations

import argparse
import copy
import glob
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAPER_DIRS = ("activeevict", "buddymoe", "commitmoe", "fmoe", "moepic")
"""The folders of ``scenarios/`` that reproduce a paper's set-ups."""

MOEPIC_QWEN_KNOBS = {"popularity_skew": 0.1, "token_locality": 0.05, "topic_strength": 0.15}
"""What the MoEpic Qwen1.5-MoE scenarios set on top of the legacy preset before the move."""


def moved_scenarios() -> list[Path]:
    """The paper scenarios whose synthetic trace names a fitted preset."""
    from moesim.traces.synthetic.presets import FITTED_PRESETS

    out = []
    for d in PAPER_DIRS:
        for p in sorted(glob.glob(str(ROOT / "scenarios" / d / "*.yaml"))):
            syn = (yaml.safe_load(Path(p).read_text()).get("trace") or {}).get("synthetic") or {}
            if syn.get("preset") in FITTED_PRESETS:
                out.append(Path(p))
    return out


def legacy_of(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The scenario ``data`` as it ran before the move: the legacy preset (and, for MoEpic's Qwen
    set-up, its hand-set knobs)."""
    old = copy.deepcopy(data)
    syn = old["trace"]["synthetic"]
    syn["preset"] = f"{syn['preset']}-legacy"
    if path.parent.name == "moepic" and path.name.startswith("qwen-"):
        syn.update(MOEPIC_QWEN_KNOBS)
    return old


def measure(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Run the scenario ``data`` (read from ``path``) with its own policy; its metrics."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.run.runner import run_loaded

    return run_loaded(load_scenario_data(data, source=str(path), base_dir=path.parent)).metrics


def tpot_ms(m: dict[str, Any]) -> float:
    """Milliseconds per token over the whole run (prefill included where the scenario has it)."""
    return 1e3 / m["tokens_per_s"] if m["tokens_per_s"] else float("nan")


def table() -> str:
    """The markdown report: one row per moved scenario, legacy beside fitted."""
    lines = [
        "# Paper scenarios on the fitted routing presets (issue 32)",
        "",
        "Made by `python benchmarks/scenario_presets.py --out benchmarks/results/fitted_scenarios.md`.",
        "Each scenario runs its own policy and workload; *legacy* is the `-legacy` preset it ran before",
        "(MoEpic's Qwen set-ups with their hand-set knobs), *fitted* the committed file. TPOT here is",
        "1000 / tokens_per_s over the whole run. *partial* is the share of expert uses found partly",
        "cached (MoEpic keeps each expert's top segment, so its uses are partial hits, never whole ones).",
        "",
        "| scenario | policy | hit rate legacy | hit rate fitted | partial legacy | partial fitted | tok/s legacy | tok/s fitted | TPOT ms legacy | TPOT ms fitted | tok/s fitted/legacy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in moved_scenarios():
        data = yaml.safe_load(path.read_text())
        old, new = measure(legacy_of(data, path), path), measure(data, path)
        ratio = new["tokens_per_s"] / old["tokens_per_s"] if old["tokens_per_s"] else float("nan")
        lines.append(
            f"| {path.relative_to(ROOT / 'scenarios')} | {new['policy']} | {old['hit_rate']:.3f} | {new['hit_rate']:.3f}"
            f" | {old['partial_rate']:.3f} | {new['partial_rate']:.3f}"
            f" | {old['tokens_per_s']:.3f} | {new['tokens_per_s']:.3f} | {tpot_ms(old):.1f} | {tpot_ms(new):.1f}"
            f" | {ratio:.2f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join([*lines, "", *knobs()])


def knobs() -> list[str]:
    """Why the rows move: the routing knobs of each model's legacy and fitted preset (a per-layer
    ``token_locality`` shown as its mean)."""
    from moesim.traces.synthetic.presets import FITTED_PRESETS, LEGACY_PRESETS

    names = ["popularity_skew", "token_locality", "layer_correlation", "topic_strength", "token_strength"]
    out = [
        "## The presets' routing knobs",
        "",
        "Lower `popularity_skew`, `token_locality` and `topic_strength` spread the routing over more",
        "experts (fewer hits for a frequency or recency cache); `token_strength` (0 in every legacy",
        "preset) ties an expert choice to the token's identity, which predictors keyed on the token",
        "or on history can use.",
        "",
        "| preset | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for model in sorted({p["model"] for p in FITTED_PRESETS.values()}):
        for name, preset in ((f"{model}-legacy", LEGACY_PRESETS[f"{model}-legacy"]), (model, FITTED_PRESETS[model])):
            vals = [preset.get(k, 0.0) for k in names]
            cells = [f"{sum(v) / len(v):.3f} (mean)" if isinstance(v, list) else f"{v:.3f}" for v in vals]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    """Print (with ``--out`` also write) the legacy-versus-fitted table of the moved scenarios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the report to this markdown file")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    # deepseek-a100-lcp-buddy.yaml loads scenarios/plugins/lcp_buddy.py, this tree's own code:
    # allowed explicitly, as golden_outputs.py allows it
    os.environ["MOESIM_ALLOW_PLUGINS"] = "1"
    text = table()
    print(text)
    if args.out:
        from results_file import write_result  # this folder is on sys.path when run as a script

        write_result(args.out, text + "\n")


if __name__ == "__main__":
    main()
