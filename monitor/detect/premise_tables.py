"""Every detector's premise table (``PREMISES`` beside its code), gathered by reading name.

``TABLES[reading]`` is the premises ``Context.holds`` judges for that reading
(``monitor.detect.premises``); a reading with no entry needs nothing.
"""

from __future__ import annotations

from monitor.detect import (
    async_pools,
    engine_detectors,
    fatal_error,
    gpu_activity,
    hang,
    health,
    io,
    memory,
    phases,
    rollout_detectors,
    skipped_updates,
    step_detectors,
)
from monitor.detect.premises import Premise, advice_tables, build_tables

#: Reading -> the premises it needs, from every detector module's ``PREMISES``.
TABLES: dict[str, tuple[Premise, ...]] = build_tables(
    gpu_activity.PREMISES, rollout_detectors.PREMISES, phases.PREMISES, io.PREMISES,
    health.PREMISES, memory.PREMISES, step_detectors.PREMISES, fatal_error.PREMISES,
    hang.PREMISES, engine_detectors.PREMISES, async_pools.PREMISES,
    skipped_updates.PREMISES, advice_tables(),
)

__all__ = ["TABLES"]
