"""CommitMoE: the fallback-free commit router."""
