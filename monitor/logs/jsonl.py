"""verl's file logger (``trainer.logger=['file']``): one JSON object per line,
``{"step": N, "data": {...}, "ts"/"timestamp": ...}``. Objects of one step may come in parts:
``JsonlMerger`` holds a step's object until a later step (or a flush) completes it. The same
step run again (after a resume from the checkpoint before it) is a new record, not a part."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from monitor.logs.stats import short_number, step_in_range
from monitor.logs.timestamps import parse_timestamp
from monitor.logs.values import json_number


@dataclass
class JsonStep:
    """The metrics of one step from JSONL objects; ``end_time`` None when no object said."""

    step: int
    metrics: dict[str, Any]
    end_time: float | None
    time_source: str


#: A step's own timer: written once per run of the step (verl's, and the pre-0.3 name).
STEP_TIMERS: tuple[str, ...] = ("timing_s/step", "timing/step")


def run_again(metrics: dict[str, Any], end_time: float | None, part: JsonStep) -> bool:
    """Whether ``part`` is its step run again, not a part of the object before it (``metrics``,
    ``end_time``): both carry the step's timer, and ``part`` ended at least that timer's
    seconds after it, so its whole run came after (a resume redid the step; a late part or a
    repeated line is never a whole step later)."""
    key = next((k for k in STEP_TIMERS if k in part.metrics and k in metrics), None)
    if key is None or end_time is None or part.end_time is None:
        return False
    took = part.metrics[key]
    return isinstance(took, (int, float)) and took > 0 and part.end_time - end_time >= took


def read_json_step(text: str) -> JsonStep | str | None:
    """One JSONL line (starting with ``{``): its step, or a str naming why a line that meant
    to be a step cannot be used, or None for other text (noise)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return "bad JSON" if '"step"' in text else None
    if not isinstance(obj, dict) or "step" not in obj:
        return None
    step_val = obj.get("step")
    if isinstance(step_val, bool) or not isinstance(step_val, (int, float)):
        return "JSON step is not a number"
    if isinstance(step_val, float) and not math.isfinite(step_val):
        return "JSON step is not finite"
    step = int(step_val)
    if not step_in_range(step):
        return f"JSON step {short_number(step)} outside 0..2**63-1"
    data = obj.get("data", {})
    if not isinstance(data, dict):
        return "JSON data is not an object"
    metrics: dict[str, Any] = {}
    for key, value in data.items():
        num = json_number(value)
        if num is not None:
            metrics[str(key)] = num
    end_time, time_source = _json_time(obj)
    return JsonStep(step, metrics, end_time, time_source)


class JsonlMerger:
    """The JSONL step being collected, and the last one emitted (a late object of that step
    re-emits it, merged)."""

    def __init__(self) -> None:
        self._pending: JsonStep | None = None
        self._done: dict[str, Any] | None = None
        self._done_step: int | None = None
        self._done_end: float | None = None

    @property
    def holding(self) -> bool:
        """Whether a step is being collected (not emitted yet)."""
        return self._pending is not None

    def merge(self, part: JsonStep) -> bool:
        """Add ``part`` to the step being collected when it is of that step (and not that
        step run again: :func:`run_again`)."""
        pending = self._pending
        if pending is None or pending.step != part.step:
            return False
        if run_again(pending.metrics, pending.end_time, part):
            return False
        pending.metrics.update(part.metrics)
        if part.end_time is not None:
            pending.end_time, pending.time_source = part.end_time, part.time_source
        return True

    def start(self, part: JsonStep) -> None:
        """Collect a new step (call ``close`` first); merged over the last emitted object when
        that was the same step (not when it is that step run again)."""
        if (self._done is not None and self._done_step == part.step
                and not run_again(self._done, self._done_end, part)):
            part.metrics = {**self._done, **part.metrics}
        self._pending = part

    def close(self) -> JsonStep | None:
        """The step collected so far, to emit (None when there is none)."""
        pending = self._pending
        if pending is None:
            return None
        self._pending = None
        self._done = pending.metrics
        self._done_step, self._done_end = pending.step, pending.end_time
        return pending


def _json_time(obj: dict[str, Any]) -> tuple[float | None, str]:
    ts = obj.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts):
        return float(ts), "line"
    stamp = obj.get("timestamp")
    if isinstance(stamp, str):
        value = parse_timestamp(stamp)
        if value is not None:
            return value, "line"
    elif isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
        return float(stamp), "line"
    return None, "arrival"
