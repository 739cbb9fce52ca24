"""The live monitor's derived views, served beside the collectors.

The views (flags, per-phase GPU time, goodput) compute nothing from outside the process: they
live in monitor/live/ and read the monitor's window and tracker. This module only lists them
in the collector registry, so each has its ``--collector.NAME`` flag and its
``verlmon_collector_success`` series like any collector.
"""

from __future__ import annotations

from exporters.registry import REGISTRY, CollectorSpec
from monitor.live import VIEWS

for _view in VIEWS:
    REGISTRY[_view.name] = CollectorSpec(name=_view.name, factory=_view.factory,
                                         default=_view.default, help=_view.help)
