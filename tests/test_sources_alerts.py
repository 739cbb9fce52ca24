"""Firing cross-node alerts read back from Prometheus become flags under their own names naming
the node and GPU; ``/api/v1/rules`` answers split into firing (with the start Slack shows) and
pending, and the flag kinds an alert rule reads."""

from __future__ import annotations

import calendar

from dashboards.sources.alerts import FIRING_QUERY, SINCE_QUERY, alert_flags


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
        ("GPUStraggler", {"node": "n2", "gpus": [3]}, 880.0, None),
        ("NodeImbalance", {"node": "n5"}, 1000.0, None)]
    assert flags[0].evidence.startswith("GPU 3 on n2 is the straggler")
    assert "Prometheus alert GPUStraggler" in flags[0].evidence
    assert flags[1].evidence.startswith("Node n5 is the slow node") and flags[1].advice


def test_queries_ask_only_for_the_cross_node_alerts():
    for q in (FIRING_QUERY, SINCE_QUERY):
        assert "GPUStraggler" in q and "NodeImbalance" in q and "GPULagging" in q
    assert 'alertstate="firing"' in FIRING_QUERY
    assert alert_flags([], [], now=1.0) == []


def test_one_job_only_when_the_source_is_limited_to_a_job():
    from dashboards.sources.alerts import alert_selector

    assert alert_selector(FIRING_QUERY, None) == FIRING_QUERY
    assert alert_selector(SINCE_QUERY, "grpo").endswith(',job="grpo"}')


def _rules(alerts, query='verlmon_gpu_sm_active > 1', name="GPUStraggler", duration=30.0,
           interval=15.0):
    return [{"name": "g", "interval": interval, "rules": [
        {"type": "alerting", "name": name, "query": query, "duration": duration,
         "alerts": alerts},
        {"type": "recording", "name": "job:x", "query": "sum(up)"}]}]


def _alert(state, active="2026-12-01T12:00:00Z", **labels):
    return {"state": state, "activeAt": active, "labels": labels, "annotations": {
        "description": "Its SMs were busy 90% of the last minute.\nAdvice: Turn on "
                       "trainer.balance_batch=True.\nRunbook: https://x/docs/runbooks.md#g",
        "runbook_url": "https://x/docs/runbooks.md#g"}}


def test_a_firing_alert_starts_when_it_began_to_fire_and_a_pending_one_is_not_firing():
    from dashboards.sources.alerts import active_alerts, cross_node_flag

    at = float(calendar.timegm((2026, 12, 1, 12, 0, 0)))
    groups = _rules([_alert("firing", job="a", node="n3", gpu="1", severity="warning"),
                     _alert("pending", active="2026-12-01T12:01:00Z", job="a", node="n2",
                            gpu="0", severity="warning"),
                     _alert("firing", job="b", node="n9", gpu="0")], duration=20.0)
    alerts, kinds = active_alerts(groups, job="a")
    assert [(a.state, a.labels["node"]) for a in alerts] == [("firing", "n3"),
                                                              ("pending", "n2")]
    # for: 20 s at 15 s evaluations: it fired at the second evaluation after activeAt
    assert alerts[0].fired_at == at + 30.0 and alerts[1].fired_at is None
    assert kinds == set()
    flag = cross_node_flag(alerts[0])
    assert (flag.kind, flag.scope, flag.start) == ("GPUStraggler", {"node": "n3", "gpus": [1]},
                                                   at + 30.0)
    assert flag.evidence == "Its SMs were busy 90% of the last minute."
    assert flag.advice[0] == "Turn on trainer.balance_batch=True."
    assert flag.advice[-1] == "Runbook: https://x/docs/runbooks.md#g"


def test_rules_reading_an_exporter_flag_name_its_kind():
    from dashboards.sources.alerts import active_alerts

    q = ('verlmon_flag_active{kind="low_utilization"} == 1 unless on (job) '
         'ALERTS{alertname=~"GPUStraggler|NodeImbalance"}')
    alerts, kinds = active_alerts(_rules([], query=q, name="VerlLowUtilization"))
    assert alerts == [] and kinds == {"low_utilization"}
