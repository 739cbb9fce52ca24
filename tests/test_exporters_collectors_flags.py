"""Flags collector: open flags and raised counts from a real FlagTracker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.collectors.flags import FlagsCollector
from exporters.registry import ExporterContext
from monitor.detect.live import FlagTracker
from monitor.records import FLAG_KINDS, SEVERITIES, Flag


def make():
    tracker = FlagTracker()
    ctx = ExporterContext(node="n0", interval=1.0, tracker=tracker)
    reg = CollectorRegistry()
    reg.register(FlagsCollector(ctx))
    return tracker, reg


def test_open_flags_and_raised_counts():
    tracker, reg = make()
    imbalance = Flag("gpu_imbalance", "warning", start=100.0, end=None,
                     scope={"node": "n0", "gpus": [3]}, evidence="GPU 3 at 40% vs 90%")
    stalled = Flag("stalled", "critical", start=110.0, end=None, scope={"node": "n0"})
    tracker.update([imbalance, stalled], now=120.0)
    active = {"kind": "gpu_imbalance", "severity": "warning", "node": "n0", "gpu": "3",
              "phase": ""}
    assert reg.get_sample_value("verlmon_flag_active", active) == 1
    assert reg.get_sample_value("verlmon_flag_active", {"kind": "stalled",
                                "severity": "critical", "node": "n0", "gpu": "",
                                "phase": ""}) == 1
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
    ctx = ExporterContext(node="n0", interval=1.0)
    reg = CollectorRegistry()
    reg.register(FlagsCollector(ctx))
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "stalled", "severity": "critical"}) is None
    assert list(FlagsCollector(ctx).collect()) == []


def test_scope_is_separate_labels_and_info_carries_evidence_and_advice():
    tracker, reg = make()
    long_evidence = "rollout took " + "very " * 80 + "long"
    tracker.update([
        Flag("rollout_long_tail", "warning", start=10.0, end=None,
             scope={"phase": "gen", "gpus": [2, 5]}, evidence=long_evidence,
             advice=["Raise actor_rollout_ref.rollout.n\nfor more samples.", "second"]),
    ], now=20.0)
    # no node in the scope: the exporter's own node
    labels = {"kind": "rollout_long_tail", "severity": "warning", "node": "n0", "gpu": "2,5",
              "phase": "gen"}
    assert reg.get_sample_value("verlmon_flag_active", labels) == 1
    info = [s for metric in reg.collect() if metric.name == "verlmon_flag_info"
            for s in metric.samples]
    assert len(info) == 1 and info[0].value == 1
    got = info[0].labels
    assert {k: got[k] for k in labels} == labels
    assert got["advice"] == "Raise actor_rollout_ref.rollout.n for more samples."
    assert len(got["evidence"]) <= 200 and got["evidence"].startswith("rollout took very")
    assert got["evidence"].endswith("…")


def test_raised_counters_exist_at_zero_for_every_kind_before_any_flag():
    _tracker, reg = make()
    for kind in FLAG_KINDS:
        for severity in SEVERITIES:
            assert reg.get_sample_value("verlmon_flags_raised_total",
                                        {"kind": kind, "severity": severity}) == 0, kind
    assert reg.get_sample_value("verlmon_flag_active", {"kind": "oom", "severity": "critical",
                                "node": "n0", "gpu": "", "phase": ""}) is None
