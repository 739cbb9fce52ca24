"""Flags collector: open flags and raised counts from a real FlagTracker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitor.live import ViewContext
from monitor.live.flag_series import FlagsCollector
from monitor.live.flag_tracker import FlagTracker
from monitor.records import FLAG_KINDS, SEVERITIES, Flag


def make():
    tracker = FlagTracker()
    ctx = ViewContext(node="n0", interval=1.0, tracker=tracker)
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
    ctx = ViewContext(node="n0", interval=1.0)
    reg = CollectorRegistry()
    reg.register(FlagsCollector(ctx))
    assert reg.get_sample_value("verlmon_flags_raised_total",
                                {"kind": "stalled", "severity": "critical"}) is None
    assert list(FlagsCollector(ctx).collect()) == []


def test_scope_is_separate_labels_and_info_carries_evidence_and_advice_whole():
    tracker, reg = make()
    evidence = ("GPU 1 is the straggler in update_actor: its SM activity averaged 81% while "
                "GPU 0, GPU 2, GPU 3, GPU 4, GPU 5, GPU 6 and GPU 7 waited at 53-58% with "
                "their utilization near 100% (they spin in collectives): 6 of the last 6 steps")
    advice = ["Raise actor_rollout_ref.rollout.n\nfor more samples.",
              "Check GPU 1's clocks and temperature (nvidia-smi -q -d CLOCK,TEMPERATURE) "
              "and its XID errors before moving work off it."]
    tracker.update([
        Flag("rollout_long_tail", "warning", start=10.0, end=None,
             scope={"phase": "gen", "gpus": [2, 5]}, evidence=evidence, advice=advice),
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
    # every piece of advice, a line each; the evidence whole (the old 200-character cut and
    # the exposition's 128-character digest cut the numbers off)
    assert got["advice"].split("\n") == ["Raise actor_rollout_ref.rollout.n for more samples.",
                                         advice[1]]
    assert got["evidence"] == evidence
    # what Prometheus scrapes: the same words, no "...#digest"
    from exporters.exposition import format_families

    text = format_families(FlagsCollector(tracker_ctx(tracker)).collect()).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("verlmon_flag_info{"))
    assert f'evidence="{evidence}"' in line and "...#" not in line
    assert "nvidia-smi -q -d CLOCK,TEMPERATURE) and its XID errors" in line


def tracker_ctx(tracker: FlagTracker) -> ViewContext:
    return ViewContext(node="n0", interval=1.0, tracker=tracker)


def test_a_runaway_evidence_is_cut_at_a_word_with_an_ellipsis_not_a_digest():
    tracker, reg = make()
    tracker.update([Flag("fatal_error", "critical", start=1.0, end=None,
                         evidence="log said " + "word " * 2000)], now=2.0)
    from exporters.exposition import format_families
    from monitor.live.flag_series import TEXT_MAX

    text = format_families(FlagsCollector(tracker_ctx(tracker)).collect()).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("verlmon_flag_info{"))
    evidence = line.split('evidence="', 1)[1].split('"', 1)[0]
    assert len(evidence) <= TEXT_MAX and evidence.endswith("word…") and "#" not in evidence


def test_raised_counters_exist_at_zero_for_every_kind_before_any_flag():
    _tracker, reg = make()
    for kind in FLAG_KINDS:
        for severity in SEVERITIES:
            assert reg.get_sample_value("verlmon_flags_raised_total",
                                        {"kind": kind, "severity": severity}) == 0, kind
    assert reg.get_sample_value("verlmon_flag_active", {"kind": "oom", "severity": "critical",
                                "node": "n0", "gpu": "", "phase": ""}) is None
