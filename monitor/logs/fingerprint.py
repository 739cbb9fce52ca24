"""A step record's identity by content, so a step read twice is kept once.

A log read again (after a restart, a rotation, a copy) gives the same step lines again, but a
console line carries no time, so the record's end time differs each time it is read. What
stays the same is what the line says: its source, step number and values. A true resume (the
step number goes back after a checkpoint load) runs the step again and logs other values,
so it keeps a fingerprint of its own.
"""

from __future__ import annotations

import hashlib
import json

from monitor.records import StepRecord


def step_fingerprint(step: StepRecord) -> str:
    """sha1 (hex) of the step's source, number, total, phases and raw metrics."""
    body = json.dumps([step.source, step.step, step.total, step.phases, step.metrics],
                      sort_keys=True, default=str, allow_nan=True, separators=(",", ":"))
    return hashlib.sha1(body.encode("utf-8", "replace")).hexdigest()
