"""Running one scenario: preparation, choosing the replay, metrics, warnings and outputs."""
