"""Integrations with other tools (optional dependencies, imported only when used)."""
