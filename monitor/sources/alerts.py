"""The cross-node alerts of ``prometheus/rules/alerts.yml`` as flags, for the pages.

A node without the log judges nothing that needs the phase timeline; the nodes are compared in
Prometheus instead (``NodeImbalance``, ``GPUStraggler``; ``GPULagging`` is retired but still
read from an older rule set). So that the Nodes
page, the Overview and the Flags page give the same verdict as those alerts, a firing one is
read back from Prometheus (``ALERTS``, with its start from ``ALERTS_FOR_STATE``) and shown as a
``gpu_imbalance`` flag naming the node and GPU.
"""

from __future__ import annotations

from monitor.detect.advice import advice_for
from monitor.records import Flag

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
    """Open ``gpu_imbalance`` flags from the instant vectors of :data:`FIRING_QUERY` and
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
            kind=str(labels.get("kind") or "gpu_imbalance"),
            severity=str(labels.get("severity") or "warning"),
            start=started.get(_key(labels), now),
            end=None,
            scope=scope,
            evidence=f"{words} (Prometheus alert {name}, prometheus/rules/alerts.yml).",
            advice=list(advice_for("gpu_imbalance") or []),
        ))
    return flags
