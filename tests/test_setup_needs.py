"""Every policy declares its setup needs; studies run each policy as its paper meant it or mark
the point n/a with the reason, apply and name the defaults they give, and rank lossless,
lossy and oracle policies in separate groups (compare.md, the figures, the sweep's Parquet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from moesim.policies.contract.base import OPTIONAL_COLUMNS, Policy
from moesim.policies.contract.needs import DEFAULT_PROFILE_SHARE, TOP_K, SetupNeeds
from moesim.policies.contract.registry import make_policy, policy_class, policy_names
from moesim.sim.cli.main import main
from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.study.needs import fit_group, profile_note, trace_facts
from moesim.sim.study.sweep import SweepSpec, expand
from moesim.sim.study.sweep_run import run_sweep
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
# a small synthetic Mixtral (4 layers of 8 experts, top-2) whose trace has every column
SYNTH: dict[str, Any] = {
    "name": "needs", "model": {"base": "mixtral-8x7b", "num_layers": 4}, "hardware": "a100-pcie-80gb",
    "trace": {"synthetic": {"preset": "mixtral-8x7b", "num_layers": 4, "requests": 4, "prompt_len": 4,
                            "decode_len": 12, "seed": 0}},
    "cache": {"experts_per_layer": 3}, "policy": "lru", "workload": {"batch_size": 1, "phases": ["decode"]}, "seed": 0}


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _section(md: str, title: str) -> list[list[str]]:
    """The rows of the Markdown table under the heading that starts with ``title``."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"### {title}"))
    rows = []
    for line in lines[start + 4:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


# --- the declarations ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_declares_its_needs(name: str) -> None:
    cls = policy_class(name)
    assert "setup_needs" in cls.__dict__, f"{name} does not declare setup_needs on its own class"
    declared = cls.__dict__["setup_needs"]
    assert isinstance(declared, SetupNeeds)
    pol = make_policy(name)
    needs = pol.needs()
    assert isinstance(needs, SetupNeeds)
    assert needs.columns <= set(OPTIONAL_COLUMNS)
    assert pol.required_columns() <= needs.columns, f"{name} requires columns its needs do not declare"
    if not needs.empty:
        assert needs.source, f"{name}: needs without the source of their defaults"
    if needs.min_tokens_param is not None and needs.min_tokens is None:
        assert getattr(pol, needs.min_tokens_param) is None
    expected = "oracle" if cls.oracle else ("lossy" if cls.lossy else "lossless")
    assert pol.kind() == expected


def test_needs_follow_the_parameters() -> None:
    assert make_policy("mixtral-offloading").needs().columns == {"lookahead_logits"}
    assert not make_policy("mixtral-offloading", {"predictor": "previous-token"}).needs().columns
    moepic = make_policy("moepic").needs()
    assert (moepic.buffer_experts, moepic.min_tokens, moepic.min_tokens_param) == (TOP_K, 5000, "tau")
    assert make_policy("moepic", {"tau": 64}).needs().min_tokens == 64
    assert make_policy("moepic", {"configurator": False}).needs().min_tokens is None
    assert make_policy("moepic", {"prefetch": False}).needs().buffer_experts is None
    assert not make_policy("moepic", {"speculative": False}).needs().columns
    trained = make_policy("commitmoe", {"predictor": "trained"}).needs()
    assert trained.columns == {"logits"} and trained.profile_share == DEFAULT_PROFILE_SHARE
    assert make_policy("buddymoe").needs().columns == {"lookahead_logits"}           # its base prefetches
    assert not make_policy("buddymoe", {"base": "lru"}).needs().columns
    assert make_policy("buddymoe", {"base": "lru"}).needs().profile_share == DEFAULT_PROFILE_SHARE
    assert make_policy("fmoe").needs().profile_share == 0.7                            # the 7:3 history
    assert make_policy("fmoe", {"semantic": False}).needs().columns == {"logits"}
    assert not make_policy("activeevict", {"score": "hotness"}).needs().columns
    assert make_policy("activeevict", {"dynamic_topk": False}).kind() == "lossless"
    with pytest.raises(ValueError, match="profile_share"):
        SetupNeeds(profile_share=1.0)


def test_a_declared_buffer_in_experts() -> None:
    # what simctl study and the speed benchmarks give a point that sets no cache.buffer_experts
    assert make_policy("moepic").needs().buffer_size(2) == 2.0                        # U_b = K
    assert make_policy("moepic").needs().buffer_size(8) == 8.0
    assert make_policy("moepic", {"prefetch": False}).needs().buffer_size(8) == 0.0
    assert SetupNeeds(buffer_experts=1.5).buffer_size(8) == 1.5
    assert make_policy("lru").needs().buffer_size(2) == 0.0


# --- fitting one group ---------------------------------------------------------------------------
def _items(data: dict[str, Any], policies: list[str | tuple[str, dict[str, Any]]]) -> list[tuple[dict[str, Any], Any, Policy]]:
    out = []
    for p in policies:
        name, params = (p, {}) if isinstance(p, str) else p
        d = json.loads(json.dumps(data))
        d["policy"] = {"name": name, "params": params}
        out.append((d, load_scenario_data(json.loads(json.dumps(d)), source="t", base_dir=ROOT / "scenarios"),
                    make_policy(name, params)))
    return out


def test_a_profile_split_is_shared_and_sized_to_what_the_workload_leaves() -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    items = _items(data, ["lru", "static"])
    facts = trace_facts(items[0][1])
    assert facts.columns == {"weights", "token_id"} and len(facts.requests) == 32 and facts.top_k == 6
    fits = fit_group(items, facts)
    assert [f.data["profile"] for f in fits] == [{"requests": 16}, {"requests": 16}]   # lru gets it too
    assert fits[0].applied == fits[1].applied and "every policy replays the same 16" in fits[0].applied[0]
    data["workload"]["requests"] = 20            # 20 to replay leave 12 to profile
    assert fit_group(_items(data, ["static"]), facts)[0].data["profile"] == {"requests": 12}
    data["workload"]["requests"] = [3, 9]        # a listed request is never profiled
    assert fit_group(_items(data, ["static"]), facts)[0].data["profile"] == {"requests": 3}
    data["workload"]["requests"] = [0, 9]
    fit = fit_group(_items(data, ["static", "lru"]), facts)
    assert fit[0].unmet is not None and "needs a profile: split" in fit[0].unmet and fit[1].unmet is None
    data["workload"]["requests"] = "all"
    data["profile"] = {"requests": 4}             # the scenario's own split is kept as it is
    fit = fit_group(_items(data, ["static"]), facts)[0]
    assert fit.data["profile"] == {"requests": 4} and not fit.applied


def test_a_run_shorter_than_a_policys_period_is_not_applicable() -> None:
    items = _items(SYNTH, ["moepic", ("moepic", {"tau": 40}), "moepic-cache-only"])
    fits = fit_group(items, trace_facts(items[0][1]))
    assert fits[0].unmet == ("needs a run of at least 5000 routed tokens (tau); this workload routes 48: "
                             "replay more tokens or lower policy.params.tau")
    assert fits[1].unmet is None and fits[2].unmet is None
    # the buffer MoEpic stages through (K = top_k = 2) is given to every point that runs
    assert [f.data["cache"].get("buffer_experts") for f in fits] == [2, 2, 2]
    assert fits[2].applied[0].startswith("cache.buffer_experts=2 (top_k = 2, for moepic: MoEpic section 4.1")


# --- compare: n/a with the reason, groups, defaults said ------------------------------------------
def test_compare_groups_lossless_lossy_and_bounds_and_says_why_a_policy_did_not_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    policies = "lru,mixtral-offloading,activeevict,belady,random-substitute,no-cache"
    code, md, err = _cli(["compare", str(QUICKSTART), "-p", policies, "--set", "workload.requests=2",
                          "--out", str(out), "-j", "1", "--no-progress"], capsys)
    assert code == 0, err
    heads = [line for line in md.splitlines() if line.startswith("### ")]
    assert [h.split(" ")[1] for h in heads] == ["Lossless", "Lossy", "Bounds:", "Not"]
    lossless = _section(md, "Lossless")
    assert [r[0] for r in lossless] == ["1", "2"] and {r[1] for r in lossless} == {"lru", "no-cache"}
    lossy = _section(md, "Lossy")
    assert [r[:2] for r in lossy] == [["1", "random-substitute"]]     # ranked apart, from 1
    head = md.splitlines()[md.splitlines().index(heads[1]) + 2]
    assert "mass kept %" in head and "subst./token" in head and "top-1 kept %" in head
    assert [r[:2] for r in _section(md, "Bounds")] == [["bound", "belady (bound)"]]
    n_a = {r[0]: r[2] for r in _section(md, "Not run")}
    assert n_a["mixtral-offloading"] == "needs trace column lookahead_logits, which the trace (flame-moe-290m) lacks"
    assert "needs cache.swap_out: true" in n_a["activeevict"] and "lookahead_logits" in n_a["activeevict"]
    assert "2 points n/a" in err
    df = pd.read_parquet(out / "results.parquet").set_index("policy")
    assert df.loc["mixtral-offloading", "status"] == "n/a" and df.loc["mixtral-offloading", "wall_s"] == 0
    assert df["kind"].to_dict() == {"lru": "lossless", "mixtral-offloading": "lossless", "activeevict": "lossy",
                                    "belady": "oracle", "random-substitute": "lossy", "no-cache": "lossless"}
    csv = pd.read_csv(out / "compare.csv", keep_default_na=False, na_values=[""]).set_index("policy")
    assert csv.loc["activeevict", "status"] == "n/a" and csv.loc["random-substitute", "kind"] == "lossy"
    assert csv.loc["random-substitute", "rank"] == 1 and csv.loc["lru", "rank"] in (1, 2)


def test_compare_applies_a_default_and_carries_a_warning_beside_its_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "synth.yaml"
    scen.write_text(yaml.safe_dump(SYNTH, sort_keys=False))
    code, md, err = _cli(["compare", str(scen), "-p", "lru,moepic-prefetch-only", "--out", str(tmp_path / "a"),
                          "-j", "1", "--no-progress", "--no-figure"], capsys)
    assert code == 0, err
    assert ("Setup defaults applied to every run: cache.buffer_experts=2 (top_k = 2, for moepic-prefetch-only: "
            "MoEpic section 2.3") in md
    df = pd.read_parquet(tmp_path / "a" / "results.parquet").set_index("policy")
    assert all("cache.buffer_experts=2" in json.loads(a)[0] for a in df["applied"])
    assert not any("transfer buffer" in w for w in json.loads(df.loc["moepic-prefetch-only", "warnings"]))
    assert all(r[-1] == "" for r in _section(md, "Lossless"))          # clean runs: no notes
    # a setting the user gives is kept; the run then falls back and its row says so
    code, md, err = _cli(["compare", str(scen), "-p", "lru,moepic-prefetch-only", "--set", "cache.buffer_experts=0",
                          "--out", str(tmp_path / "b"), "-j", "1", "--no-progress", "--no-figure"], capsys)
    assert code == 0, err
    assert "Setup defaults applied" not in md
    notes = {r[1]: r[-1] for r in _section(md, "Lossless")}
    assert notes["lru"] == "" and notes["moepic-prefetch-only"] == "w1"
    assert "- w1: moepic-prefetch-only: the transfer buffer (cache.buffer_experts) holds no expert segment" in md


# --- sweeps: the kind column, defaults applied, lossy drawn dashed ---------------------------------
def test_a_sweep_records_kind_and_applied_and_draws_lossy_dashed(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from moesim.sim.study.plot import sweep_figure

    spec = SweepSpec(name="groups", base=str(QUICKSTART), set={"workload.requests": 1},
                     grid={"policy": ["lru", "static", "belady", "random-substitute", "pregated"],
                           "cache.rate": [0.25, 0.5]})
    sweep = expand(spec, source="test", base_dir=ROOT / "scenarios")
    outcome = run_sweep(sweep, tmp_path / "o", jobs=1)
    assert not outcome.failed and outcome.ran == 8 and len(outcome.not_applicable) == 2
    df = pd.read_parquet(outcome.table)
    kinds = dict(zip(df["policy"], df["kind"], strict=False))
    assert kinds == {"lru": "lossless", "static": "lossless", "belady": "oracle",
                     "random-substitute": "lossy", "pregated": "lossless"}
    ok = df[df["status"] == "ok"]
    assert all(json.loads(a)[0].startswith("profile.requests=16 (50% of the trace's 32 requests, for static")
               for a in ok["applied"])
    assert (ok["requests"] == 1).all()                                # one request replayed by every policy
    static = ok[ok["policy"] == "static"]
    assert not any("optimistic" in w for ws in static["warnings"] for w in json.loads(ws))
    assert set(df[df["status"] == "n/a"]["policy"]) == {"pregated"}
    fig = sweep_figure(df, ["policy", "cache.rate"], "tpot")
    lines = {c.get_label(): c.lines[0].get_linestyle() for c in fig.axes[0].containers}
    assert lines == {"lru": "-", "static": "-", "belady (bound)": ":", "random-substitute (lossy)": "--"}
    plt.close(fig)


def test_the_applied_note_says_the_share_applied() -> None:
    """fMoE asks for 70% of the trace; 2 requests make 1 (50%): the note says 50%, then what was
    asked and why it differs (issue 35: it said 70%)."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["workload"]["requests"] = 30            # 32 requests, 30 replayed: 2 left to profile
    fit = fit_group(_items(data, ["static"]), trace_facts(_items(data, ["static"])[0][1]))[0]
    assert fit.data["profile"] == {"requests": 2}
    assert fit.applied[0].startswith("profile.requests=2 (6% of the trace's 32 requests, for static: ")
    assert "50% asked, 16 requests, made 2 (the workload's requests come first)" in fit.applied[0]
    note = profile_note(1, 2, 0.7, "fmoe", "fMoE's 7:3 split", 1)
    assert note.startswith("profile.requests=1 (50% of the trace's 2 requests") and "70% asked, 1.4 requests, made 1 " \
        "(whole requests)" in note and "70% of" not in note
    assert "asked" not in profile_note(16, 32, 0.5, "lru", "moesim's share", 16)
