"""verl-monitor core: canonical records, verl log parsing, detectors, run store, sources.

Nothing here starts a server or touches a UI (see ARCHITECTURE.md).
"""

__version__ = "0.1.0"
