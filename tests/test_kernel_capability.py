"""Kernels are chosen by the capability a policy's parts declare (``kernel``,
policies/parts/kernel.py), not by class: a declaration holds only for the class that makes it,
any composition of declared parts that adds no hook takes the kernel (with the event loop's
exact results), and one that adds a hook does not. The kernels read the parts' state through
public accessors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from moesim.policies.baselines.pregated import PreGatePrefetcher
from moesim.policies.baselines.speculative import MixtralOffloading
from moesim.policies.contract.base import (
    EvictionRequest,
    Outcome,
    Policy,
    ReadView,
    UnitKey,
    VictimChoice,
    View,
)
from moesim.policies.contract.registry import make_policy
from moesim.policies.parts.caches import LFUCache, LRUCache, RandomCache, RecencyCache, StaticCache
from moesim.policies.parts.compose import Composed
from moesim.policies.parts.deciders.base import LayerDecider
from moesim.policies.parts.deciders.lru import LruDecider
from moesim.policies.parts.predictors import AutoPredictor, OraclePredictor, TrainedPredictor
from moesim.policies.parts.prefetchers import NextLayerPrefetcher
from moesim.sim.engine.cost import CostModel
from moesim.sim.engine.event_loop import Engine
from moesim.sim.engine.workload import build_workload
from moesim.sim.fast.kernel_choice import next_layer_parts, sole_rule
from moesim.sim.fast.path import FAST_PATH
from moesim.sim.run.metrics import compute_metrics
from tests.util import assert_same_replays, random_trace, tiny_hw, tiny_model


class _MyLRU(LRUCache):
    """A subclass that changes nothing, but says nothing either."""


class _DeclaredLRU(LRUCache):
    """A subclass that declares the decider anew."""

    decider = LruDecider


class _OracleNextLayer(Composed):
    """An unregistered composition of an LRU rule and an oracle next-layer prefetcher."""

    name = "my-oracle-next-layer"
    oracle = True

    def __init__(self) -> None:
        self.assemble(cache=LRUCache(), prefetcher=NextLayerPrefetcher(OraclePredictor(), cross_token=True))


class _Hooked(MixtralOffloading):
    """mixtral-offloading with a hook of its own (that changes nothing)."""

    name = "hooked-mixtral-offloading"

    def after_layer(self, view: View, layer: int, outcome: Outcome) -> None:
        super().after_layer(view, layer, outcome)


class _MruDecider(LayerDecider):
    """Most recently used, as a decider: a step's victims are the residents outside the step
    used most recently (its accesses then go last)."""

    name = "test-mru"

    def plan_layer(self, layer: int, seq: list[list[int]], idxs: list[int], misses: list[Any],
                   evictions: list[int]) -> int:
        pool, cap, evicted = self.pools[layer], self.slots[layer], self.evicted[layer]
        refetch = 0
        for s, exps in enumerate(seq):
            k = s * self.L + layer
            miss = [e for e in exps if e not in pool]
            if miss:
                idx = idxs[s]
                refetch += sum(1 for e in miss if evicted.get(e, -2) >= idx - 1)
                over = len(pool) + len(miss) - cap
                if over > 0:
                    for v in [v for v in reversed(pool) if v not in exps][:over]:
                        del pool[v]
                        evicted[v] = idx
                    evictions[k] = over
                misses[k] = miss
            for e in exps:
                pool[e] = None
                pool.move_to_end(e)
        return refetch


class _MRU(RecencyCache):
    """A cache rule the simulator does not ship, bringing its own decider."""

    name = "test-mru"
    decider = _MruDecider

    def demand_only(self) -> bool:
        return True

    def victim(self, view: ReadView, request: EvictionRequest, candidates: Sequence[UnitKey]
               ) -> VictimChoice:
        return max(candidates, key=self.last_used)


def _run(policy: Policy, *, fast: bool, budget: int = 6) -> tuple[Engine, dict[str, Any]]:
    tr = random_trace(5, layers=3, experts=8, top_k=2, requests=2, prompt=0, decode=12)
    m = tr.model
    model = tiny_model(m.num_layers, m.num_experts, m.top_k)
    eng = Engine(build_workload(tr, phases=["decode"]), policy, CostModel(model, tiny_hw()),
                 budget_bytes=budget * model.expert_bytes, fast_replay=FAST_PATH if fast else None)
    eng.run()
    return eng, compute_metrics(eng.state)


def rule_kernel(policy: Policy) -> str | None:
    """The kernel that ``policy``'s sole cache rule declares, or None."""
    rule = sole_rule(policy)
    return None if rule is None else rule.kernel


def test_a_declaration_holds_only_for_the_class_that_makes_it() -> None:
    assert (LRUCache.kernel, LFUCache.kernel, RandomCache.kernel, StaticCache.kernel) == ("lru", "lfu", "random", "static")
    assert _MyLRU.kernel is None and _DeclaredLRU.kernel == "lru"
    assert NextLayerPrefetcher.kernel == "next-layer" and PreGatePrefetcher.kernel is None
    assert (AutoPredictor.kernel, OraclePredictor.kernel, TrainedPredictor.kernel) == ("auto", "oracle", None)
    assert rule_kernel(make_policy("lru")) == "lru" and rule_kernel(LFUCache()) == "lfu"
    assert rule_kernel(_MyLRU()) is None and rule_kernel(_DeclaredLRU()) == "lru"
    assert rule_kernel(make_policy("mixtral-offloading")) is None   # a prefetcher joins the rule
    assert next_layer_parts(make_policy("mixtral-offloading")) is not None
    assert next_layer_parts(_OracleNextLayer()) is not None
    assert next_layer_parts(_Hooked()) is None


def test_any_plain_composition_of_declared_parts_takes_the_kernel_exactly() -> None:
    slow, ms = _run(_OracleNextLayer(), fast=False)
    fast, mf = _run(_OracleNextLayer(), fast=True)
    assert slow.state.path == "event"
    assert fast.state.path == "fast (my-oracle-next-layer kernel)", fast.state.path_reason
    assert_same_replays(slow, ms, fast, mf)
    assert mf["prefetch_gb"] > 0


def test_a_composition_with_a_hook_of_its_own_takes_the_driver() -> None:
    """No kernel stands in for a composition with a hook of its own: the SimPy-free driver
    replays it through its hooks."""
    eng, m = _run(_Hooked(), fast=True)
    assert eng.state.path == "fast"
    plain, mp = _run(make_policy("mixtral-offloading"), fast=True)
    assert plain.state.path == "fast (mixtral-offloading kernel)"
    for x in (m, mp):
        for k in ("engine_path", "engine_path_reason", "policy"):
            x.pop(k)
    assert m == mp   # the hook changes nothing: the kernel and the event loop agree


def test_an_undeclared_rule_takes_the_generic_replay() -> None:
    eng, _ = _run(_MyLRU(), fast=True)
    assert eng.state.path == "fast"   # demand-only, replayed through its hooks: no cache kernel
    eng, _ = _run(_DeclaredLRU(), fast=True)
    assert eng.state.path == "fast (lru kernel)"


def test_a_rule_brings_its_own_decider_and_the_kernel_replays_it_exactly() -> None:
    """A cache rule outside the simulator declares a decider: the cache kernel replays it
    (no edit of sim/fast), with the event loop's exact metrics and step records."""
    assert _MRU.kernel == "test-mru"
    slow, ms = _run(_MRU(), fast=False, budget=9)
    fast, mf = _run(_MRU(), fast=True, budget=9)
    assert fast.state.path == "fast (test-mru kernel)", fast.state.path_reason
    assert_same_replays(slow, ms, fast, mf)
    assert mf["evictions"] > 0


def test_a_cache_rule_declares_a_decider_not_a_kernel_name() -> None:
    with pytest.raises(TypeError, match="declares its decider"):
        type("_Named", (LRUCache,), {"kernel": "lru"})


def test_public_accessors_of_the_parts() -> None:
    rule = LRUCache()
    rule.warm(None, [(0, 1, 0), (0, 2, 0)])   # type: ignore[arg-type]
    uses = rule.last_uses()
    assert uses == {(0, 1, 0): 1, (0, 2, 0): 2} and rule.clock == 2
    uses.clear()   # a copy: the rule keeps its own
    assert rule.last_used((0, 2, 0)) == 2
    pf = NextLayerPrefetcher(OraclePredictor(), experts=3)
    assert pf.experts_per_token == 0   # resolved at setup
    eng, _ = _run(make_policy("random"), fast=False)
    cache = eng.state.policy.cache   # type: ignore[attr-defined]
    assert cache.rng is eng.state.ctx.rng
