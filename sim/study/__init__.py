"""Studies over many runs: sweeps, comparisons, figures and hit-rate curves."""
