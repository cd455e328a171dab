"""Importers that turn other tools' router logs into moe-trace files."""
