"""Deciders: a cache rule's vectorised decision function, for the demand-only cache kernel of
the fast path (:mod:`moesim.sim.fast.order`). A rule that has one declares it as its
``decider`` (:class:`~moesim.policies.parts.caches.CacheRule`); the kernel then times the steps
and the decider says which accesses hit, which miss and how many residents each step evicts
(:mod:`.base`). One file per rule: :mod:`.lru`, :mod:`.fifo` (FIFO, and ``static``'s FIFO
beside its static set), :mod:`.lfu`, :mod:`.random` (with :mod:`.draws`), :mod:`.belady`."""
