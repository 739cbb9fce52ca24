"""Shared test set-up.

Every test under ``tests/e2e/`` is marked ``e2e`` whether or not its module says so, so the
fast loop (``make test-fast``, which runs ``-m "not e2e"``) never picks up a slow end-to-end
test by accident, and ``make test`` still runs everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected from ``tests/e2e/`` as ``e2e``."""
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
