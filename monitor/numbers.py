"""Number coercion shared by the report, the run summary and the wandb sink."""

from __future__ import annotations

import math
from typing import Any


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, else None (None, bools, non-numbers, NaN and inf).

    Bools are refused on purpose: a True in a metrics dict is a flag, not the number 1.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None
