"""What moesim demands of every policy, as a function a plugin author can call:
:func:`check_policy` (scikit-learn's ``check_estimator``). The registry's own tests call it for
every registered policy (``tests/test_policies_conformance.py``).

The rules, in the order they are checked (the first three before anything runs):

* ``declared``: the class has a ``name`` and a ``summary`` (one line for ``simctl policies``);
* ``keyword-parameters``: every ``__init__`` parameter is keyword-only (no positional
  parameters, no ``*args``/``**kwargs``), with a default, so the policy builds with its defaults;
* ``stores-parameters``: each keyword is kept as an attribute of the same name, unchanged, for
  its default and for a changed value (``get_params`` reads them back; every run checks this);
* ``vram-within-budget``: runs on a small random trace never hold more than the budget and the
  transfer buffer, whatever the batch, buffer, ``swap_out``, copy order and synchronous
  prefetch, and their counters add up;
* ``same-seed-same-output``: two runs with one seed give the same metrics and step records;
* ``never-reads-the-future`` (unless the class is an ``oracle``): two traces that differ only in
  their last two tokens give the same step records up to them.

A failure is a :class:`ConformanceError` naming the rule, and the parameter or the run case.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moesim.policies.contract.base import CausalityError, Policy
from moesim.policies.contract.registry import policy_params, unstored_param
from moesim.sim.engine.event_loop import Engine
from moesim.testing.fixtures import random_trace, run_engine, swap_last_tokens, tiny_hw, tiny_model


class ConformanceError(AssertionError):
    """A policy class breaks a rule of :func:`check_policy`; ``rule`` names it, ``detail`` says
    where (the parameter, or the run's settings)."""

    def __init__(self, policy: str, rule: str, detail: str) -> None:
        super().__init__(f"{policy}: rule {rule!r}: {detail}")
        self.policy, self.rule, self.detail = policy, rule, detail


@dataclass(frozen=True)
class Check:
    """One rule on one case: ``run(cls)`` raises :class:`ConformanceError` when ``cls`` breaks it."""

    rule: str
    case: str
    run: Callable[[type[Policy]], None]

    @property
    def id(self) -> str:
        """``rule`` or ``rule[case]`` (a test id)."""
        return f"{self.rule}[{self.case}]" if self.case else self.rule

    def __call__(self, cls: type[Policy]) -> None:
        """Check ``cls``: any failure (an exception of the policy's own included) is a
        :class:`ConformanceError` naming this rule and case (the original is its cause)."""
        where = f" (run with {self.case})" if self.case else ""
        try:
            self.run(cls)
        except ConformanceError as exc:
            if not where:
                raise
            raise ConformanceError(exc.policy, exc.rule, exc.detail + where) from exc
        except CausalityError as exc:   # the view refused a read of the future, whatever the run
            raise ConformanceError(_label(cls), "never-reads-the-future",
                                   f"{type(exc).__name__}: {exc}{where}") from exc
        except Exception as exc:
            raise ConformanceError(_label(cls), self.rule, f"{type(exc).__name__}: {exc}{where}") from exc


def _label(cls: type[Policy]) -> str:
    return cls.name or cls.__qualname__


def _changed(default: object) -> object:
    """A value of ``default``'s type that differs from it (None: no such value to try; a string
    is a choice, and other strings may be invalid names)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 0.5 if default else 0.5
    return None


def check_declared(cls: type[Policy]) -> None:
    """Rule ``declared``: a registry name and a summary."""
    if not cls.name:
        raise ConformanceError(_label(cls), "declared", "the class has no `name` (its registry key)")
    if not cls.summary:
        raise ConformanceError(_label(cls), "declared", "the class has no `summary` (its line in `simctl policies`)")


def check_keyword_parameters(cls: type[Policy]) -> None:
    """Rule ``keyword-parameters``: ``__init__`` takes keyword-only parameters with defaults,
    and builds with them."""
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise ConformanceError(_label(cls), "keyword-parameters",
                                   f"parameter {p.name!r} is {p.kind.description}; put every parameter after `*`")
        if p.default is inspect.Parameter.empty:
            raise ConformanceError(_label(cls), "keyword-parameters", f"parameter {p.name!r} has no default")
    try:
        pol = cls()
    except Exception as exc:
        raise ConformanceError(_label(cls), "keyword-parameters",
                               f"does not build with its defaults: {type(exc).__name__}: {exc}") from exc
    if pol.name != cls.name:
        raise ConformanceError(_label(cls), "declared", f"an instance is named {pol.name!r}, the class {cls.name!r}")


def check_stores_parameters(cls: type[Policy]) -> None:
    """Rule ``stores-parameters``: each keyword kept as an attribute of the same name,
    unchanged, for its default and for a changed value (one outside the parameter's range,
    refused with ``ValueError``/``TypeError``, is skipped)."""
    problem = unstored_param(cls())
    if problem is None:
        for key, default in policy_params(cls).items():
            value = _changed(default)
            if value is None:
                continue
            try:
                pol = cls(**{key: value})
            except (TypeError, ValueError):   # outside the parameter's range: nothing to compare
                continue
            problem = unstored_param(pol, {key: value})
            if problem:
                break
    if problem:
        raise ConformanceError(_label(cls), "stores-parameters", problem)


# copy-queue disciplines every policy must survive: priority (default), one fifo stream, and
# synchronous prefetch (the GPU waits for every issued prefetch before each layer)
QUEUES = (("priority", False), ("fifo", False), ("priority", True), ("fifo", True))
"""(``pcie.order``, ``pcie.sync_prefetch``) pairs."""


def _steps(engine: Engine) -> list[tuple[Any, ...]]:
    cols = engine.state.steps.columns()
    return list(zip(*(cols[name].tolist() for name in sorted(cols)), strict=True))


def _vram_within_budget(batch: int, budget: int, buffer: int, swap_out: bool, order: str, sync: bool
                        ) -> Callable[[type[Policy]], None]:
    def run(cls: type[Policy]) -> None:
        tr = random_trace(1, layers=3, experts=8, top_k=2, requests=3)
        model, hw = tiny_model(3, 8, 2), tiny_hw()
        eng, m = run_engine(tr, cls(), model, hw, budget_experts=budget, buffer_experts=buffer,
                            batch_size=batch, phases=("prefill", "decode"), swap_out=swap_out,
                            pcie_order=order, sync_prefetch=sync)
        vram = eng.state.vram
        peak, limit = eng.state.stats.vram_peak_bytes, (budget + buffer) * model.expert_bytes
        facts = [
            (peak <= limit, f"VRAM peak {peak} bytes above the budget and buffer, {limit}"),
            (m["hits"] + m["late"] + m["partial"] + m["misses"] == m["accesses"],
             "hits + late + partial + misses differ from accesses"),
            (m["accesses"] + m["cpu_expert_runs"] > 0, "no expert ran"),
            (all(u >= 0 for u in vram.used), "a pool's used bytes went negative"),
            (all(d >= 0 for d in vram.draining) and vram.buffer_draining >= 0, "draining bytes went negative"),
            (0.0 <= m["gpu_busy_fraction"] <= 1.0 + 1e-9, f"gpu_busy_fraction {m['gpu_busy_fraction']}"),
        ]
        if cls.lossy:
            facts.append((0 < m["routing_mass_kept"] <= 1 and m["effective_top_k"] > 0,
                          "a lossy policy's routing_mass_kept or effective_top_k out of range"))
        if swap_out:   # only what was loaded can be copied back (the last copies may still be in flight)
            facts.append((m["d2h_gb"] <= m["h2d_gb"] + 1e-12, "more copied back than loaded"))
            facts.append((m["d2h_gb"] > 0 or m["evictions"] == 0, "evictions without copy-backs under swap_out"))
        else:
            facts.append((m["d2h_gb"] == 0, "copy-backs without swap_out"))
        for ok, what in facts:
            if not ok:
                raise ConformanceError(cls.name, "vram-within-budget", what)
    return run


def _same_seed_same_output(swap_out: bool, order: str, sync: bool) -> Callable[[type[Policy]], None]:
    def run(cls: type[Policy]) -> None:
        tr = random_trace(2, requests=2)
        model, hw = tiny_model(3, 8, 2), tiny_hw()
        runs = [run_engine(tr, cls(), model, hw, budget_experts=9, seed=7, initial="random",
                           swap_out=swap_out, pcie_order=order, sync_prefetch=sync)
                for _ in range(2)]
        if runs[0][1] != runs[1][1]:
            diff = sorted(k for k in runs[0][1] if runs[0][1][k] != runs[1][1].get(k))
            raise ConformanceError(cls.name, "same-seed-same-output", f"metrics differ: {', '.join(diff)}")
        if _steps(runs[0][0]) != _steps(runs[1][0]):
            raise ConformanceError(cls.name, "same-seed-same-output", "step records differ")
    return run


def _never_reads_the_future(order: str, sync: bool, swap_out: bool) -> Callable[[type[Policy]], None]:
    def run(cls: type[Policy]) -> None:
        tr_a = random_trace(3, requests=2, decode=8)
        tr_b = swap_last_tokens(tr_a)
        assert not np.array_equal(tr_a.experts, tr_b.experts)
        model, hw = tiny_model(3, 8, 2), tiny_hw()
        eng_a, _ = run_engine(tr_a, cls(), model, hw, budget_experts=9, pcie_order=order,
                              sync_prefetch=sync, swap_out=swap_out)
        eng_b, _ = run_engine(tr_b, cls(), model, hw, budget_experts=9, pcie_order=order,
                              sync_prefetch=sync, swap_out=swap_out)
        n_iters = len(eng_a.state.workload.iterations)
        # everything up to the first swapped token (the second-to-last iteration) is identical
        cols = eng_a.state.steps.columns()
        it = sorted(cols).index("iteration")
        prefix_a = [s for s in _steps(eng_a) if s[it] < n_iters - 2]
        prefix_b = [s for s in _steps(eng_b) if s[it] < n_iters - 2]
        if not prefix_a or prefix_a != prefix_b:
            raise ConformanceError(cls.name, "never-reads-the-future",
                                   "the steps before the last two tokens depend on them (a non-oracle "
                                   "policy read later routing)")
    return run


def policy_checks(cls: type[Policy]) -> list[Check]:
    """Every check of :func:`check_policy` for ``cls``, in order (the parameter rules first),
    for a test suite that runs them one by one."""
    out = [Check("declared", "", check_declared),
           Check("keyword-parameters", "", check_keyword_parameters),
           Check("stores-parameters", "", check_stores_parameters)]
    for batch, budget, buffer in ((1, 12, 0), (2, 6, 2), (3, 9, 0)):
        for swap_out in (False, True):
            for order, sync in QUEUES:
                case = f"batch={batch} budget={budget} buffer={buffer} swap_out={swap_out} order={order} sync={sync}"
                out.append(Check("vram-within-budget", case,
                                 _vram_within_budget(batch, budget, buffer, swap_out, order, sync)))
    for swap_out in (False, True):
        for order, sync in (("priority", False), ("fifo", True)):
            out.append(Check("same-seed-same-output", f"swap_out={swap_out} order={order} sync={sync}",
                             _same_seed_same_output(swap_out, order, sync)))
    if not cls.oracle:
        for order, sync, swap_out in (("priority", False, False), ("fifo", True, True)):
            out.append(Check("never-reads-the-future", f"order={order} sync={sync} swap_out={swap_out}",
                             _never_reads_the_future(order, sync, swap_out)))
    return out


def check_policy(cls: type[Policy]) -> None:
    """Check that the policy class ``cls`` keeps moesim's contract (the rules in this module's
    docstring): its parameters first, before any run, then runs on small random traces under
    every copy-queue discipline, with and without ``swap_out`` and a transfer buffer. Raises
    :class:`ConformanceError` naming the rule and the parameter or the run's settings; returns
    None when every rule holds. A few seconds per policy.

    >>> from moesim.testing import check_policy
    >>> check_policy(MyPolicy)   # doctest: +SKIP
    """
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"check_policy takes a Policy subclass, got {cls!r}")
    for check in policy_checks(cls):
        check(cls)
