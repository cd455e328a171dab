"""Fiddler (Kamahori et al., ICLR 2025): popularity placement and a per-miss choice between CPU compute and a copy."""
