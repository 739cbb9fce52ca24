"""One text per flag (issue 31): a flag read back from Prometheus has the exporter's whole
evidence and every piece of its advice, and a rule's description (the Slack text) splits back
into the same evidence and advice lines."""

from __future__ import annotations

from dashboards.sources.alerts import split_description
from dashboards.sources.prometheus import _flag_from

EVIDENCE = ("GPU 1 is the straggler in update_actor: its SM activity averaged 81% while GPU 0, "
            "GPU 2, GPU 3, GPU 4, GPU 5, GPU 6 and GPU 7 waited at 53-58%")
ADVICE = ["Set trainer.balance_batch=True so each data-parallel rank gets a similar token "
          "count.", "Check GPU 1 clocks and temperature (nvidia-smi -q -d CLOCK,TEMPERATURE)."]


def test_a_flag_from_prometheus_has_the_exporters_whole_advice_not_the_table() -> None:
    labels = {"job": "grpo", "instance": "n0:9048", "kind": "gpu_imbalance",
              "severity": "warning", "node": "node-a", "gpu": "1", "phase": "update_actor"}
    note = {**labels, "evidence": EVIDENCE, "advice": "\n".join(ADVICE)}
    flag = _flag_from(labels, note, 100.0, None)
    assert flag.evidence == EVIDENCE
    assert flag.advice == ADVICE  # before: the first piece, then the detectors' generic table


def test_an_exporter_without_advice_gets_the_detectors_table() -> None:
    flag = _flag_from({"kind": "stalled"}, {"evidence": "no step"}, 1.0, None)
    assert flag.advice and all(isinstance(a, str) and a for a in flag.advice)


def test_the_rule_description_splits_into_the_flags_evidence_and_advice() -> None:
    description = (f"{EVIDENCE}\nAdvice:\n• {ADVICE[0]}\n• {ADVICE[1]}\n"
                   "Runbook: https://example.org/docs/runbooks.md#gpustraggler")
    evidence, advice = split_description(description)
    assert evidence == EVIDENCE
    assert advice[:2] == ADVICE  # no bullet kept: the same words as the store's flag
    assert advice[2].startswith("Runbook: https://")
