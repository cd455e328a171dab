"""ActiveEvict: budget-aware pre-eviction and dynamic top-k."""
