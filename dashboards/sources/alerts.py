"""The cross-node alerts of ``prometheus/rules/alerts.yml`` as flags, for the pages.

A node without the log judges nothing that needs the phase timeline; the nodes are compared in
Prometheus instead (``NodeImbalance``, ``GPUStraggler``; ``GPULagging`` is retired but still
read from an older rule set). So that the Nodes
page, the Overview and the Flags page give the same verdict as those alerts, a firing one is
read back from Prometheus (``ALERTS``, with its start from ``ALERTS_FOR_STATE``) and shown as a
flag under the alert's own name (``GPUStraggler``, ``NodeImbalance``) naming the node and GPU.

One rule for every page (issue 24): a flag read from Prometheus is open while its alert FIRES,
and starts when it began to fire, the moment Alertmanager sends as the Slack message's "since"
(Prometheus's ``FiredAt``: ``activeAt`` plus the rule's ``for:``, rounded up to the group's
evaluations). A pending alert, or a flag whose alert rule holds it back (``VerlLowUtilization``
while a straggler alert explains it), is shown apart, never as an open flag. Both come from one
``/api/v1/rules`` answer (:func:`active_alerts`); without alert rules loaded the exporters'
flags are shown as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from monitor.api import Flag, advice_for

#: alert name -> what it says, in words (node and GPU filled in)
CROSS_NODE_ALERTS: dict[str, str] = {
    "NodeImbalance": "Node {node} is the slow node: its GPUs' SMs stay busier than the job's "
                     "other nodes, which spin in collectives waiting for it",
    "GPULagging": "GPU {gpu} on {node} stays far below the job's other GPUs: the ranks on it "
                  "hold back every collective",
    "GPUStraggler": "GPU {gpu} on {node} is the straggler: its SMs stay busy while the job's "
                    "other GPUs spin in collectives waiting for it",
}
_NAMES = "|".join(CROSS_NODE_ALERTS)
#: firing cross-node alerts, and when each became active
FIRING_QUERY = f'ALERTS{{alertstate="firing",alertname=~"{_NAMES}"}}'
SINCE_QUERY = f'ALERTS_FOR_STATE{{alertname=~"{_NAMES}"}}'


def alert_selector(query: str, job: str | None) -> str:
    """``query`` limited to one Prometheus job (its alerts carry the ``job`` label)."""
    return query if not job else query.replace("}", f',job="{job}"}}', 1)


def _key(labels: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in labels.items()
                        if k not in ("__name__", "alertstate")))


def alert_flags(firing: list[dict], since: list[dict], now: float) -> list[Flag]:
    """Open flags, under the alerts' names, from the instant vectors of :data:`FIRING_QUERY` and
    :data:`SINCE_QUERY` (Prometheus's ``/api/v1/query`` results); ``now`` starts an alert
    whose activation time is missing."""
    started = {_key(s["metric"]): float(s["value"][1]) for s in since}
    flags = []
    for s in firing:
        labels = s["metric"]
        name = labels.get("alertname", "")
        node = str(labels.get("node") or labels.get("instance") or "?")
        gpu = labels.get("gpu")
        scope: dict = {"node": node}
        if gpu not in (None, ""):
            scope["gpus"] = [int(gpu) if str(gpu).isdigit() else gpu]
        words = CROSS_NODE_ALERTS.get(name, name).format(node=node, gpu=gpu)
        flags.append(Flag(
            kind=str(name or labels.get("kind") or "gpu_imbalance"),
            severity=str(labels.get("severity") or "warning"),
            start=started.get(_key(labels), now),
            end=None,
            scope=scope,
            evidence=f"{words} (Prometheus alert {name}, prometheus/rules/alerts.yml).",
            advice=list(advice_for("gpu_imbalance") or []),
        ))
    return flags


#: cross-node alert name -> the flag kind whose cause relation it shares (``suppress`` of
#: ``monitor/defaults.yaml``: a straggler explains its peers' low activity)
ALERT_BASE_KIND: dict[str, str] = {name: "gpu_imbalance" for name in CROSS_NODE_ALERTS}
#: the exporter flag kind an alert rule reads: ``verlmon_flag_active{kind="io_starvation"}``
_FLAG_RULE = re.compile(r'verlmon_flag_active\{[^}]*kind="([A-Za-z0-9_]+)"')


def base_kind(kind: str) -> str:
    """The flag kind behind ``kind``: a cross-node alert's (``GPUStraggler`` ->
    ``gpu_imbalance``), else ``kind`` itself."""
    return ALERT_BASE_KIND.get(kind, kind)


@dataclass(frozen=True)
class ActiveAlert:
    """One pending or firing alert from ``/api/v1/rules``."""

    name: str
    state: str  # "pending" or "firing"
    labels: dict
    annotations: dict
    active_at: float
    #: when it began to fire (Alertmanager's ``startsAt``); None while pending
    fired_at: float | None
    #: the exporter flag kind its rule reads, None for the other rules
    flag_kind: str | None


def _unix(text) -> float | None:
    try:
        return float(pd.Timestamp(text).timestamp())
    except (TypeError, ValueError):
        return None


def active_alerts(groups: list[dict], job: str | None = None
                  ) -> tuple[list[ActiveAlert], set[str]]:
    """The pending and firing alerts of ``/api/v1/rules`` (its ``data.groups``), of ``job``
    only when given, and the exporter flag kinds some alerting rule reads (a flag of such a
    kind is open on the pages exactly while its alert fires)."""
    alerts: list[ActiveAlert] = []
    kinds: set[str] = set()
    for group in groups or []:
        interval = float(group.get("interval") or 0.0)
        for rule in group.get("rules") or []:
            if rule.get("type") != "alerting":
                continue
            found = _FLAG_RULE.search(str(rule.get("query") or ""))
            flag_kind = found.group(1) if found else None
            if flag_kind:
                kinds.add(flag_kind)
            hold = float(rule.get("duration") or 0.0)
            for a in rule.get("alerts") or []:
                labels = dict(a.get("labels") or {})
                if job and labels.get("job") != job:
                    continue
                active = _unix(a.get("activeAt"))
                if active is None:
                    continue
                state = str(a.get("state") or "")
                fired = None
                if state == "firing":
                    evals = -(-hold // interval) if interval > 0 else 0.0
                    fired = active + (evals * interval if interval > 0 else hold)
                alerts.append(ActiveAlert(str(rule.get("name") or labels.get("alertname", "")),
                                          state, labels, dict(a.get("annotations") or {}),
                                          active, fired, flag_kind))
    return alerts, kinds


def split_description(text: str) -> tuple[str, list[str]]:
    """A rule's ``description`` as (evidence, advice lines): the text before "Advice:", then
    each line of advice without its bullet (the runbook line kept last)."""
    text = (text or "").strip()
    head, sep, tail = text.partition("Advice:")
    advice = [ln.strip().removeprefix("• ").strip() for ln in tail.splitlines()
              if ln.strip().removeprefix("•").strip()] if sep else []
    return " ".join(head.split()), advice


def cross_node_flag(alert: ActiveAlert) -> Flag:
    """A cross-node alert as a flag under its own name: the scope its labels name, its start
    the moment it began to fire (when it became active, while pending), its description's
    evidence and advice (the words Slack shows), else the built-in words and the advice table."""
    labels = alert.labels
    node = str(labels.get("node") or labels.get("instance") or "?")
    gpu = labels.get("gpu")
    scope: dict = {"node": node}
    if gpu not in (None, ""):
        scope["gpus"] = [int(gpu) if str(gpu).isdigit() else gpu]
    evidence, advice = split_description(alert.annotations.get("description", ""))
    if not evidence:
        words = CROSS_NODE_ALERTS.get(alert.name, alert.name).format(node=node, gpu=gpu)
        evidence = f"{words} (Prometheus alert {alert.name}, prometheus/rules/alerts.yml)."
    runbook = str(alert.annotations.get("runbook_url") or "")
    if runbook and not any(runbook in a for a in advice):
        advice.append(f"Runbook: {runbook}")
    if not advice:
        advice = list(advice_for(base_kind(alert.name)) or [])
    return Flag(kind=alert.name, severity=str(labels.get("severity") or "warning"),
                start=alert.fired_at if alert.fired_at is not None else alert.active_at,
                end=None, scope=scope, evidence=evidence, advice=advice)
