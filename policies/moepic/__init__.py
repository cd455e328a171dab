"""MoEpic (Yan et al.): expert split, LCP cache, speculative prefetch and the cache configurator."""
