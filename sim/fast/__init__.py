"""Exact SimPy-free replays of the event loop for the runs they can reproduce, and their eligibility."""
