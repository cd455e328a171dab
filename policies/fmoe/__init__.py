"""fMoE (Yu et al.): expert maps, semantic and trajectory prefetch."""
