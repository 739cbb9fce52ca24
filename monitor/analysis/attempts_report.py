"""The ``Attempts`` section of ``verl-monitor analyze``'s text report: each attempt's
ledger, the job's ETTR, what each failure cost, and the checkpoint cadence."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from monitor.analysis.attempts import BUCKETS
from monitor.analysis.cadence import duration

_SHORT = {"productive": "productive", "redone": "redone", "overhead": "start-up",
          "checkpoint": "saves", "validation": "validation", "between_steps": "between steps",
          "hang": "hang", "crash_loss": "crash", "shutdown": "shutdown",
          "after_last_step": "after the last step", "between_attempts": "between attempts"}


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(t)))


def _split(seconds: Mapping[str, float], keys) -> str:
    parts = [f"{_SHORT[k]} {duration(seconds[k])}" for k in keys if seconds.get(k, 0.0) >= 0.5]
    return ", ".join(parts) or "nothing booked"


def show(ledger: Mapping[str, Any] | None) -> bool:
    """Whether the report shows the section: several attempts, or one that failed."""
    atts = (ledger or {}).get("attempts") or []
    return len(atts) > 1 or any(a["ended_by"] not in ("finished", "unknown", "running")
                                for a in atts)


def attempt_lines(ledger: Mapping[str, Any]) -> list[str]:
    """One line an attempt, then its buckets."""
    out = []
    for a in ledger["attempts"]:
        steps = (f"steps {a['first_step']}-{a['last_step']}" if a["first_step"] is not None
                 else "no step")
        resumed = f", resumed from step {a['resumed_from']}" if a["resumed_from"] is not None \
            else ""
        redone = f" ({a['redone_steps']} redone)" if a["redone_steps"] else ""
        out.append(f"  #{a['attempt']} {_when(a['start'])} UTC, {duration(a['wall'])}: {steps}"
                   f"{redone}{resumed}; {a['ended_by']}"
                   + (f": {a['detail']}" if a["detail"] else ""))
        out.append(f"      {_split(a['seconds'], BUCKETS)}")
    return out


def job_lines(ledger: Mapping[str, Any]) -> list[str]:
    """The job's sums, ETTR and each failure's cost."""
    secs = ledger["seconds"]
    ettr = ledger.get("ettr")
    out = [f"  job: {duration(ledger['wall'])} over {len(ledger['attempts'])} attempt(s), "
           f"{ledger['failures']} failure(s), {ledger['steps_redone']} step(s) redone, "
           f"{ledger['saves']} checkpoint save(s); ETTR "
           + (f"{ettr * 100:.1f}%" if ettr is not None else "unknown")
           + " (productive step time / wall time)",
           f"      {_split(secs, (*BUCKETS, 'between_attempts'))}"]
    out += [f"  ({p})" for p in ledger.get("premises") or []]
    for c in ledger.get("failure_costs") or []:
        back = "" if c["back"] else " so far (no later attempt got back there)"
        out.append(f"  failure #{c['attempt']} ({c['ended_by']}) cost {duration(c['seconds'])}"
                   f"{back}: from its last step to step {c['step']} done again")
    return out


def cadence_lines(cad: Mapping[str, Any] | None) -> list[str]:
    """The checkpoint cadence: the advice, or which premise is missing."""
    if not cad:
        return []
    if cad.get("advice"):
        return [f"  checkpoints: {cad['advice']}",
                f"      save cost from {cad['save_cost_source']} ({cad['saves_seen']} "
                f"save(s)); MTBF from {cad['mtbf_source']}"]
    return ["  checkpoints: no cadence advice: " + "; ".join(cad.get("missing") or [])]


def section(doc: Mapping[str, Any]) -> str | None:
    """The section's text, or None when it is not shown."""
    ledger = doc.get("attempts")
    if not show(ledger):
        return None
    return "\n".join(attempt_lines(ledger) + job_lines(ledger)
                     + cadence_lines(doc.get("cadence")))
