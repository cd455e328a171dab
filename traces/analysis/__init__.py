"""Routing statistics and hit-rate curves computed from a trace."""
