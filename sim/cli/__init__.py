"""The ``simctl`` command-line interface."""
