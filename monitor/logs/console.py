"""Console metric lines: verl's ``step:N - key:value - ...`` lines (any number format, numpy
reprs included) and the older ``Step N: name=12.3ms ...`` timing breakdowns."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from monitor.logs.keys import other_seconds
from monitor.logs.stats import short_number, step_in_range
from monitor.logs.values import to_number
from monitor.records import ALL_PHASES, StepRecord

STEP_ANYWHERE_RE = re.compile(r"(?<![\w/.-])step:")
BREAKDOWN_RE = re.compile(r"Step (\d+):\s*(.*)$")
_BREAKDOWN_FIELD_RE = re.compile(
    r"([A-Za-z_][\w/.-]*)\s*=\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(ms|us|µs|s|sec)?"
)
_BREAKDOWN_NAMES = {
    "total": None,
    "actor_gen": "gen",
    "critic_score": "values",
    "loss_comp": "update_actor",
    "rollout_wait": "rollout_wait",
    "comm": "comm",
}
_UNIT_SECONDS = {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "s": 1.0, "sec": 1.0, None: 1e-3}
_VALIDATION_PREFIXES = ("val-core/", "val-aux/", "val/", "test_score/")


@dataclass
class StepLine:
    """One console step line read. ``step`` is None when the line cannot be used at all
    (``problem`` says why); otherwise ``problem`` names a field that could not be read (the
    others are in ``metrics``). ``body`` (numpy reprs unwrapped) is for format votes."""

    step: int | None
    metrics: dict[str, Any]
    problem: str | None
    body: str = ""
    numpy_values: bool = False
    same_keys: bool = False  # the keys are those of the previous step line


class StepLineReader:
    """Reads the body of ``step:`` lines (after ``step:``); remembers the last line's keys so
    that records of one log share their key strings."""

    def __init__(self) -> None:
        self._last_keys: list[str] = []

    def read(self, body: str) -> StepLine:
        """The step number and metrics of one step line's body."""
        body = body.rstrip()
        numpy_values = "np." in body
        if numpy_values:
            body = _unwrap_numpy(body)  # np.float64(0.5) -> 0.5
        # Fast path: "N - k1:v1 - k2:v2" -> "N:k1:v1:k2:v2" -> one split, all in C.
        flat = body.replace(" - ", ":").split(":")
        step_text = flat[0].strip()
        try:
            step = int(step_text)
        except ValueError:
            num = to_number(step_text)
            if num is None or isinstance(num, bool) or not math.isfinite(num):
                return StepLine(None, {}, "bad step number")
            step = int(num)
        if not step_in_range(step):
            return StepLine(None, {}, f"step number {short_number(step)} outside 0..2**63-1")
        keys = flat[1::2]
        same_keys = keys == self._last_keys
        if same_keys:
            keys = self._last_keys  # share the key strings between records (memory)
        else:
            self._last_keys = keys
        metrics = _fast_fields(flat, keys)
        bad: str | None = None
        if metrics is None:
            metrics, bad = _careful_fields(body.split(" - ")[1:])
        return StepLine(step, metrics, bad, body, numpy_values, same_keys)


def validation_only(metrics: dict[str, Any]) -> bool:
    """Only validation keys (``val-core/``, ``val-aux/``, ``val/``; ``test_score/`` before 0.3)."""
    for key in metrics:
        if not key.startswith(_VALIDATION_PREFIXES):
            return False
    return True


def read_breakdown(
    match: re.Match[str], end_time: float | None, time_source: str
) -> StepRecord | None:
    """The record of a ``Step N: name=12.3ms ...`` line (``BREAKDOWN_RE``'s match), None when
    it holds no field. Unit-less values are milliseconds."""
    step = int(match.group(1))
    metrics: dict[str, Any] = {}
    phases: dict[str, float] = {}
    total: float | None = None
    for field_match in _BREAKDOWN_FIELD_RE.finditer(match.group(2)):
        name, number, unit = field_match.groups()
        value = float(number)
        metrics[name] = value
        seconds = value * _UNIT_SECONDS.get(unit, 1e-3)
        if not (0.0 <= seconds < math.inf):
            continue
        if name == "total":
            total = seconds
            continue
        phase = _BREAKDOWN_NAMES.get(name)
        if phase is None and name in ALL_PHASES:
            phase = name
        if phase is not None:
            phases[phase] = phases.get(phase, 0.0) + seconds
    if not metrics:
        return None
    if total is not None:
        phases["other"] = other_seconds(total, phases, include_outside_step=True)
    return StepRecord(
        step=step,
        end_time=end_time,
        total=total,
        phases=phases,
        metrics=metrics,
        time_source=time_source,
        source="breakdown",
    )


def _fast_fields(flat: list[str], keys: list[str]) -> dict[str, Any] | None:
    """``{key: float}`` from ``[step, k1, v1, k2, v2, ...]`` (``keys`` is ``flat[1::2]``);
    None when any value is not a plain float (bools, numpy reprs, damage): the careful path
    then decides."""
    if len(flat) % 2 == 0:
        return None
    try:
        return dict(zip(keys, map(float, flat[2::2]), strict=True))
    except ValueError:
        return None


def _unwrap_numpy(body: str) -> str:
    """``np.float64(0.5)`` -> ``0.5`` and friends across a whole step line body."""
    body = body.replace("np.float64(", "")
    if "np." in body:
        body = (
            body.replace("np.float32(", "")
            .replace("np.float16(", "")
            .replace("np.int64(", "")
            .replace("np.int32(", "")
            .replace("np.True_", "True")
            .replace("np.False_", "False")
        )
    body = body.replace(") - ", " - ")
    return body[:-1] if body.endswith(")") else body


def _careful_fields(parts: list[str]) -> tuple[dict[str, Any], str | None]:
    """Fields one by one (bools, odd values, damage); returns (metrics, last problem)."""
    metrics: dict[str, Any] = {}
    bad: str | None = None
    for part in parts:
        key, sep, val = part.partition(":")
        if not sep or not key:
            if part.strip():
                bad = f"field without key:value {part[:40]!r}"
            continue
        try:
            metrics[key] = float(val)
        except ValueError:
            num = to_number(val)
            if num is None:
                bad = f"bad value for {key!r}"
                continue
            metrics[key] = num
    return metrics, bad
