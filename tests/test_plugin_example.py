"""The README's policy example is the shipped plugin, word for word, and keeps the contract:
``moesim.testing.check_policy`` passes on it, and its own cache rule evicts as the shipped
LFU rule does (same step records on random traces, with and without prefetches)."""

from __future__ import annotations

import re

import pytest

from moesim.policies.contract.plugins import load_plugin
from moesim.policies.contract.registry import policy_class
from moesim.policies.parts.caches import LFUCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.predictors import make_predictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher
from moesim.testing import check_policy
from tests.util import ROOT, random_trace, run_engine, steps, tiny_hw, tiny_model

PLUGIN = ROOT / "scenarios" / "plugins" / "lfu_prefetch.py"


@pytest.fixture(scope="module")
def plugin_class() -> type:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOESIM_ALLOW_PLUGINS", "1")
        load_plugin(PLUGIN)
    return policy_class("lfu-prefetch")


def test_readme_shows_the_shipped_plugin_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Writing a policy"):]
    block = re.search(r"```python\n(.*?)```\n", section, re.S)
    assert block is not None
    assert block.group(1) == PLUGIN.read_text(), "README's example differs from scenarios/plugins/lfu_prefetch.py"


def test_the_plugin_conforms(plugin_class: type) -> None:
    check_policy(plugin_class)


class _ShippedLfu(Composed):
    name = "shipped-lfu-prefetch"

    def __init__(self, *, prefetch_experts: int = 2) -> None:
        self.prefetch_experts = prefetch_experts
        self.assemble(cache=LFUCache(),
                      prefetcher=NextLayerPrefetcher(make_predictor("auto"), experts=prefetch_experts))


@pytest.mark.parametrize("prefetch_experts,budget,batch", [(2, 9, 1), (0, 6, 1), (3, 7, 2)])
def test_the_plugins_rule_is_lfu(plugin_class: type, prefetch_experts: int, budget: int, batch: int) -> None:
    tr = random_trace(11, layers=3, experts=8, top_k=2, requests=3, decode=10)
    model, hw = tiny_model(3, 8, 2), tiny_hw()
    mine, m_mine = run_engine(tr, plugin_class(prefetch_experts=prefetch_experts), model, hw,
                              budget_experts=budget, batch_size=batch, phases=("prefill", "decode"))
    ref, m_ref = run_engine(tr, _ShippedLfu(prefetch_experts=prefetch_experts), model, hw,
                            budget_experts=budget, batch_size=batch, phases=("prefill", "decode"))
    assert m_mine["evictions"] > 0
    assert steps(mine) == steps(ref)
    named = ("policy", "engine_path_reason")   # the policy's name, in two places
    assert {k: v for k, v in m_mine.items() if k not in named} == {k: v for k, v in m_ref.items() if k not in named}
