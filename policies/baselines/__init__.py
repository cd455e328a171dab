"""The baseline policies the papers compare against (demand caches, prefetchers, bounds)."""
