"""The policy contract: hooks, what passes at a hook, the view, and the registry."""
