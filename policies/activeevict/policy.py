"""ActiveEvict: budget-aware pre-eviction and dynamic top-k ("ActiveEvict: Budget-Aware
Pre-Eviction for Efficient MoE Offloading", ACL submission; equation numbers are the paper's).

Eviction moves before routing: after layer ``l`` is routed, the next router's guess for layer
``l + 1`` and the experts' decayed hotness rank the residents of ``l + 1`` (Eq. 13); as many as
the release target (Eq. 17) asks for are evicted at once, so that with ``cache.swap_out`` their
copy-backs overlap layer ``l`` instead of sitting before ``l + 1``'s demand loads. Once
``l + 1`` is routed its misses load into the freed slots only; with more misses than free slots
the routing width shrinks (Eqs. 18-21, lossy, ``dynamic_topk``). It never prefetches.

Parameters (the paper states none of their values; the defaults are the spec sheet's
recommended ones, ours): ``alpha`` (Eq. 13, 0.5), ``gamma`` (Eq. 8, 0.9), ``window`` = T
(Eq. 8, 32 iterations), ``tau`` (Eq. 16, 0.05), ``r_max`` (Eq. 16, 1: the literal Eq. 16
over-counts for ``r_max >= 2``, section 7 A5), ``k_max`` (Eq. 20, the model's top-k).
Ablations of Figs. 7-8: ``score`` = ``prediction`` (alpha 0), ``hotness`` (alpha 1), ``lru``
(recency ranking), and ``dynamic_topk=False`` (fixed top-k: misses past the freed slots evict
on the critical path). Variants of the spec's ambiguities: ``redundancy`` (A5), ``boundary``
(A6), ``preevict_at`` (A2), ``cross_token`` (layer 0 pre-evicted after the last layer).

``boundary``: ``nonresident`` (the default) makes room for the predicted top-(k + r) experts
that are not resident, and never evicts one of them; ``literal`` is Eq. 17 as printed,
``(k - H_hat) + r`` slots whatever the boundary experts are. Eq. 16's redundancy is room "for
possible prediction errors near the top-k boundary" (section 3.3), i.e. for the experts just
below it; the printed sum frees a slot even when that expert is already resident, and then the
lowest-importance resident outside the top-k is evicted, which is often that boundary expert
itself, so the slot is made for the expert just evicted. ``nonresident`` discounts the
resident ones as Eq. 14 does for the top-k (``benchmarks/results/activeevict_miss.md``
measures both).

Its gain exists only when an eviction costs a copy back to the host: a run without
``cache.swap_out: true`` warns that only dynamic top-k can act. The Offload baseline of the
paper swaps serially; moesim's D2H lane runs beside the H2D lane (see the benchmark's note).
"""

from __future__ import annotations

from moesim.policies.activeevict.budget_topk import BudgetTopKPlanner
from moesim.policies.activeevict.importance import ImportanceCache, ImportanceScorer
from moesim.policies.activeevict.pre_eviction import PreEvictor
from moesim.policies.contract.base import Context
from moesim.policies.contract.needs import SetupNeeds
from moesim.policies.contract.registry import register
from moesim.policies.parts.compose import Composed


@register
class ActiveEvict(Composed):
    """Importance-ranked pre-eviction of the next layer plus budget-aware dynamic top-k."""

    name = "activeevict"
    summary = "ActiveEvict: pre-evict the next layer's least important experts, shrink top-k to free slots (lossy)"
    paper = "ActiveEvict: Budget-Aware Pre-Eviction for Efficient MoE Offloading (ACL submission)"
    lossy = True
    scope = "layer"
    setup_needs = SetupNeeds(columns=frozenset({"lookahead_logits"}), swap_out=True,
                             source="ActiveEvict sections 3.3-3.4: the next router's guess ranks the residents "
                                    "(Eqs. 10-13); pre-eviction hides the copies back to the host")

    def __init__(self, *, alpha: float = 0.5, gamma: float = 0.9, window: int = 32, tau: float = 0.05,
                 r_max: int = 1, k_max: int | None = None, dynamic_topk: bool = True,
                 score: str = "combined", cross_token: bool = True, redundancy: str = "literal",
                 boundary: str = "nonresident", preevict_at: str = "after_layer") -> None:
        self.alpha = alpha
        self.gamma = gamma
        self.window = window
        self.tau = tau
        self.r_max = r_max
        self.k_max = k_max
        self.dynamic_topk = dynamic_topk
        self.score = score
        self.cross_token = cross_token
        self.redundancy = redundancy
        self.boundary = boundary
        self.preevict_at = preevict_at
        self.scorer = ImportanceScorer(alpha=alpha, gamma=gamma, window=window, score=score)
        self.pre_evictor = PreEvictor(self.scorer, tau=tau, r_max=r_max, redundancy=redundancy,
                                      boundary=boundary, cross_token=cross_token, preevict_at=preevict_at)
        self.assemble(cache=ImportanceCache(self.scorer, fills_windows=False), prefetcher=self.pre_evictor,
                      planner=BudgetTopKPlanner(k_max) if dynamic_topk else None)

    def needs(self) -> SetupNeeds:
        """The lookahead only where the score reads the prediction (not ``hotness``, ``lru``, or
        ``combined`` with ``alpha`` 1)."""
        needs = super().needs()
        predicts = self.score == "prediction" or (self.score == "combined" and self.alpha < 1.0)
        return needs if predicts else needs.without(columns={"lookahead_logits"})

    def kind(self) -> str:
        """Lossy with dynamic top-k; with a fixed top-k every routed expert runs (lossless)."""
        return "lossy" if self.dynamic_topk else "lossless"

    def setup(self, ctx: Context) -> None:
        """Set up the parts; say so when evictions are free (no ``cache.swap_out``)."""
        super().setup(ctx)
        if not ctx.swap_out:
            ctx.warn("activeevict without cache.swap_out: evictions are free, so pre-eviction hides "
                     "nothing; only dynamic top-k changes the run (set cache.swap_out: true)")
