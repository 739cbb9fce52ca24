"""Flags collector: open flags and raised counts from a real FlagTracker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.collectors.flags import FlagsCollector
from exporters.registry import ExporterContext
from exporters.window import RollingWindow
from monitor.detect.live import FlagTracker
from monitor.records import Flag


def make():
    tracker = FlagTracker()
    ctx = ExporterContext(node="n0", interval=1.0, window=RollingWindow(),
                          extra={"flag_tracker": tracker})
    reg = CollectorRegistry()
    reg.register(FlagsCollector(ctx))
    return tracker, reg


def test_open_flags_and_raised_counts():
    tracker, reg = make()
    imbalance = Flag("gpu_imbalance", "warning", start=100.0, end=None,
                     scope={"node": "n0", "gpus": [3]}, evidence="GPU 3 at 40% vs 90%")
    stalled = Flag("stalled", "critical", start=110.0, end=None, scope={"node": "n0"})
    tracker.update([imbalance, stalled], now=120.0)
    active = {"kind": "gpu_imbalance", "severity": "warning", "scope": "node=n0 gpus=3"}
    assert reg.get_sample_value("verlmon_flag_active", active) == 1
    assert reg.get_sample_value("verlmon_flag_active", {"kind": "stalled",
                                "severity": "critical", "scope": "node=n0"}) == 1
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "gpu_imbalance", "severity": "warning"}) == 1
    # the imbalance resolves, the stall stays: its series goes away, the counter stays
    tracker.update([stalled], now=130.0)
    assert reg.get_sample_value("verlmon_flag_active", active) is None
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "gpu_imbalance", "severity": "warning"}) == 1
    # it comes back: raised again
    tracker.update([stalled, imbalance], now=140.0)
    assert reg.get_sample_value("verlmon_flag_active", active) == 1
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "gpu_imbalance", "severity": "warning"}) == 2


def test_without_a_tracker_nothing_is_exported():
    ctx = ExporterContext(node="n0", interval=1.0, window=RollingWindow())
    reg = CollectorRegistry()
    reg.register(FlagsCollector(ctx))
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "stalled", "severity": "critical"}) is None
    assert list(FlagsCollector(ctx).collect()) == []
