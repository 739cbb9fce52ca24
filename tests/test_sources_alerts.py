"""Firing cross-node alerts read back from Prometheus become flags naming the node and GPU."""

from __future__ import annotations

from monitor.sources.alerts import FIRING_QUERY, SINCE_QUERY, alert_flags


def _series(name, value, **labels):
    return {"metric": {"__name__": name, **labels}, "value": [1000.0, str(value)]}


def test_a_firing_straggler_alert_is_an_open_flag_on_its_node_and_gpu():
    common = {"alertname": "GPUStraggler", "job": "grpo", "node": "n2", "gpu": "3",
              "instance": "n2:9048", "severity": "warning", "kind": "gpu_imbalance"}
    firing = [_series("ALERTS", 1, alertstate="firing", **common),
              _series("ALERTS", 1, alertstate="firing", alertname="NodeImbalance", job="grpo",
                      node="n5", severity="warning", kind="gpu_imbalance")]
    since = [_series("ALERTS_FOR_STATE", 880.0, **common)]
    flags = alert_flags(firing, since, now=1000.0)
    assert [(f.kind, f.scope, f.start, f.end) for f in flags] == [
        ("gpu_imbalance", {"node": "n2", "gpus": [3]}, 880.0, None),
        ("gpu_imbalance", {"node": "n5"}, 1000.0, None)]
    assert flags[0].evidence.startswith("GPU 3 on n2 is the straggler")
    assert "Prometheus alert GPUStraggler" in flags[0].evidence
    assert flags[1].evidence.startswith("Node n5 is the slow node") and flags[1].advice


def test_queries_ask_only_for_the_cross_node_alerts():
    for q in (FIRING_QUERY, SINCE_QUERY):
        assert "GPUStraggler" in q and "NodeImbalance" in q and "GPULagging" in q
    assert 'alertstate="firing"' in FIRING_QUERY
    assert alert_flags([], [], now=1.0) == []


def test_one_job_only_when_the_source_is_limited_to_a_job():
    from monitor.sources.alerts import alert_selector

    assert alert_selector(FIRING_QUERY, None) == FIRING_QUERY
    assert alert_selector(SINCE_QUERY, "grpo").endswith(',job="grpo"}')
