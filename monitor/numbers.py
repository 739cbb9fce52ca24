"""Number coercion shared by the report, the run summary, the wandb sink, the run store, the
simulated GPUs, the detectors' premises and advice (printed config values) and the attempt
marks."""

from __future__ import annotations

import math
from typing import Any


def float_or_none(value: Any) -> float | None:
    """``value`` as a float, else None (None, non-numbers and NaN); infinities and bools pass
    (``True`` is 1.0): what the run store writes and a simulated GPU reading holds."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, else None (None, bools, non-numbers, NaN and inf).

    Bools are refused on purpose: a True in a metrics dict is a flag, not the number 1.
    """
    if isinstance(value, bool):
        return None
    out = float_or_none(value)
    return out if out is not None and math.isfinite(out) else None


def int_or_none(value: Any) -> int | None:
    """``value`` as an int (``int()``: "3" and 3.7 pass), else None (None, bools, non-numbers,
    infinities)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None
