"""benchmarks/published_figures.py: every published figure's setup is a valid scenario on the
catalogs' entries, the quantised Mixtral entries hold the bytes of the paper's Table 1, a
no-cache setup moves every routed expert, and the ranking helpers count as they say."""

from __future__ import annotations

import pytest

from benchmarks.paper_runs import run_scenario
from benchmarks.published_figures import E_M_TABLE2, concordant_pairs, published, ranks
from moesim.sim.config.catalog import get_model
from moesim.sim.config.scenario import load_scenario_data
from tests.util import ROOT

GIB = 2**30


def test_every_figure_is_a_valid_scenario() -> None:
    figs = published(requests=1, tokens=2)
    assert len(figs) == sum(len(r) * 4 for r in E_M_TABLE2.values()) + 5
    for f in figs:
        load_scenario_data(f.scenario, source=f.scenario["name"], base_dir=ROOT)


@pytest.mark.parametrize(("name", "table1_gib"), [("mixtral-8x7b-hqq-a4e2", 17.54), ("mixtral-8x7b-hqq-a4e3", 21.37)])
def test_quantised_mixtral_matches_table1(name: str, table1_gib: float) -> None:
    # arXiv 2312.17238 Table 1: whole-model size with 4-bit attention, in GiB to two decimals
    m = get_model(name)
    total = m.num_layers * m.num_experts * m.expert_bytes + m.non_expert_bytes
    assert total / GIB == pytest.approx(table1_gib, abs=0.01)


def test_no_cache_setup_loads_every_routed_expert() -> None:
    fig = next(f for f in published(requests=1, tokens=3) if f.scenario["policy"] == "no-cache")
    m, _ = run_scenario(fig.scenario)
    model = get_model(fig.scenario["model"])
    per_token = model.num_layers * model.top_k * model.expert_bytes / 1e9
    assert m["hit_rate"] == 0.0
    assert m["h2d_gb_per_token"] == pytest.approx(per_token, rel=1e-6)


def test_ranks_and_pairs() -> None:
    assert ranks([2.0, 3.0, 1.0]) == [2, 1, 3]
    assert concordant_pairs([3.0, 2.0, 1.0], [30.0, 20.0, 10.0]) == (3, 3)
    assert concordant_pairs([3.0, 2.0, 1.0], [10.0, 20.0, 30.0]) == (0, 3)
    assert concordant_pairs([3.0, 2.0, 1.0], [20.0, 30.0, 10.0]) == (2, 3)
