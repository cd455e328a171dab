"""Foundations every layer uses: the one-line error family, whole-or-nothing outputs, strict YAML."""
