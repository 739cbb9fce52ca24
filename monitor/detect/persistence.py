"""Persistence and hysteresis over a condition series, shared by every detector.

A flag opens only after its condition has held for ``open_after`` consecutive points (steps or
time windows) and closes only after it has been false for ``close_after`` consecutive points,
so a flag never flaps on one noisy sample. Unknown points (``None``/NaN) keep the current state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Episode:
    """One stretch during which a flag is open, as indices into the condition series.

    ``onset`` is the first point of the run that opened it, ``opened`` the point at which the
    persistence was met (the flag's start), ``last`` the last point where the condition held,
    ``closed`` the point at which hysteresis closed it (None while still open at the end).
    """

    onset: int
    opened: int
    last: int
    closed: int | None


def _state(value: object) -> bool | None:
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return bool(value)


def episodes(cond: Sequence[object], open_after: int = 1, close_after: int = 1) -> list[Episode]:
    """Open/close episodes of a boolean condition series with persistence and hysteresis."""
    open_after = max(1, int(open_after))
    close_after = max(1, int(close_after))
    out: list[Episode] = []
    is_open = False
    run_true = 0
    run_false = 0
    onset = opened = last = -1
    for i, raw in enumerate(cond):
        value = _state(raw)
        if value is None:
            continue
        if not is_open:
            if value:
                if run_true == 0:
                    onset = i
                run_true += 1
                if run_true >= open_after:
                    is_open = True
                    opened = i
                    last = i
                    run_false = 0
            else:
                run_true = 0
        else:
            if value:
                last = i
                run_false = 0
            else:
                run_false += 1
                if run_false >= close_after:
                    out.append(Episode(onset, opened, last, i))
                    is_open = False
                    run_true = 0
    if is_open:
        out.append(Episode(onset, opened, last, None))
    return out
