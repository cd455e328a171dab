"""Studies over many runs: sweeps, comparisons, figures, hit-rate curves, fits to measurements
(``simctl fit``) and advice on settings (``simctl advise``)."""
