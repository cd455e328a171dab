"""Synthetic router traces: the latent-state generator and its fit to a recorded trace."""
