"""Parts that policies are assembled from (see :mod:`moesim.policies.parts.compose`): cache rules
(:mod:`.caches`), predictors of coming routing (:mod:`.predictors`), prefetchers that issue
their predictions (:mod:`.prefetchers`) and planners that decide what runs (:mod:`.planners`).
Each part is a :class:`~moesim.policies.contract.base.Policy` whose hooks it overrides; on its own a
cache rule is a complete demand-caching policy."""
