"""Numbers as verl prints them: ``1.000``, ``2e-06``, ``nan``, ``-inf``, ``True``,
``np.float64(0.5)``, ``np.int64(-1)``, ``np.True_``; and JSON values (``null`` is NaN)."""

from __future__ import annotations

import math
import re

Number = float | int | bool

_THREE_DEC_RE = re.compile(r"-?\d+\.\d{3}")
_SPECIALS = frozenset({"nan", "inf", "-inf", "NaN", "Infinity", "-Infinity"})


def to_number(text: str) -> Number | None:
    """The number a printed value stands for, or None when it is not a number.

    Floats (any repr, ``nan``/``inf``), ``True``/``False``, numpy 2 scalar reprs
    (``np.float64(...)``, ``np.int64(...)``, ``np.float32(...)``, ``np.True_``). Never raises.
    """
    try:
        return float(text)
    except ValueError:
        pass
    except TypeError:
        return None
    text = text.strip()
    if text == "True":
        return True
    if text == "False":
        return False
    if text.startswith("np."):
        if text == "np.True_":
            return True
        if text == "np.False_":
            return False
        open_at = text.find("(")
        if open_at > 3 and text.endswith(")"):
            inner = text[open_at + 1 : -1].strip()
            if inner.startswith("'") or inner.startswith('"'):
                inner = inner[1:-1]
            if inner == "True":
                return True
            if inner == "False":
                return False
            try:
                value = float(inner)
            except ValueError:
                return None
            if text[3:6] in ("int", "uin") and value.is_integer():
                return int(value)
            return value
        return None
    if text.startswith("tensor(") and text.endswith(")"):
        inner = text[7:-1].split(",", 1)[0].strip()
        try:
            return float(inner)
        except ValueError:
            return None
    return None


def json_number(value: object) -> Number | None:
    """A metric value from a JSON document: numbers and bools as they are, ``null`` as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        num = to_number(value)
        return num
    return None


def value_format(texts: list[str]) -> str | None:
    """The number format of one step line's printed values: ``"numpy"`` (any ``np.`` value),
    ``"3dec"`` (every finite value with exactly 3 decimals), ``"repr"``; None with too few."""
    finite = 0
    three = 0
    for text in texts:
        if text.startswith("np."):
            return "numpy"
        if text in _SPECIALS:
            continue
        finite += 1
        if _THREE_DEC_RE.fullmatch(text):
            three += 1
    if finite < 5:
        return None
    return "3dec" if three == finite else "repr"


#: Longest duration a verl timer can report, seconds (30 days): past it (``1e12``, ``1e308``)
#: the value is damage, not a step; a timestamp built from it would be out of range.
MAX_DURATION_S = 30 * 86400.0
_TIMER_PREFIXES = ("timing_s/", "timing/")
#: Keys under ``timing_s/`` that count rather than time: the agent loop's preemptions, for which
#: verl prints -1 where the engine does not say (not tracked, not damage).
_COUNTS = ("/num_preempted",)


def absurd_durations(metrics: dict[str, object]) -> dict[str, float]:
    """The timers (``timing_s/*``, ``timing/*``) of one step whose finite value is negative or
    longer than ``MAX_DURATION_S``: key -> value. NaN and inf are left to the readers, which
    already skip them; the counts under ``timing_s/`` (``_COUNTS``, -1 when not tracked) are
    not timers."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.startswith(_TIMER_PREFIXES) or isinstance(value, bool) or any(
                part in key for part in _COUNTS):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value) and not (
                0.0 <= value <= MAX_DURATION_S):
            out[key] = float(value)
    return out
