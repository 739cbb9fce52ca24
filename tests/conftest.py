"""Shared test set-up.

Every test under ``tests/e2e/`` is marked ``e2e`` whether or not its module says so, so the
fast loop (``make test-fast``, which runs ``-m "not e2e and not slow"``) never picks up an
end-to-end test by accident, and ``make test`` still runs everything. Unit tests that start
processes (the CLI, an exporter, Streamlit's AppTest, promtool, Prometheus, wandb's service)
or wait on purpose carry ``@pytest.mark.slow`` themselves.

Helpers shared by test modules live beside this file and are imported by name:
``ports.free_port`` (a free TCP port), ``detect_builders`` (frames for the detectors),
``tls_cert`` (a throw-away certificate).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Naive dates are read in the host's zone (monitor.logs.timestamps.naive_epoch): tests assume
# UTC; a test that needs another zone sets TZ in its own subprocess.
os.environ["TZ"] = "UTC"
time.tzset()

pytest_plugins = ["timing_report", "scheduling"]

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test collected from ``tests/e2e/`` as ``e2e``."""
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
