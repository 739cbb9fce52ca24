"""Placing a log without a clock in the time of samples recorded beside it.

A console log with no dated line has relative times (``ParsedLog.clock == "relative"``), and
one whose progress bar only a dated line before it places (``tqdm_after``: the bar started
then or later, often a minute later) is dated only to that bound; GPU and host samples carry
unix times. The two can be read together only through what they share:
the steps that the exporter's store recorded with their capture times (``verl-monitor export``
writes them as ``train.jsonl`` beside ``gpu.csv``). The median gap between a step's end in the
store and in the log, over the steps both have, moves the log into the samples' time; without
a shared step nothing is moved and the samples are not used (no number is built on a guess).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from monitor.records import Event, StepRecord

#: Steps both sides must share to place the log (one is enough: its end is measured on both).
MIN_SHARED = 1


def offset_by_steps(log_steps: list[StepRecord], reference: list[StepRecord]) -> float | None:
    """Seconds to add to the log's times so its steps end when ``reference``'s (measured)
    steps of the same number ended: the median over the steps both have; None without one."""
    from monitor.logs.clocks import DATED

    ends = {s.step: s.end_time for s in reference
            if s.end_time is not None and s.time_source in DATED}
    gaps = [ends[s.step] - s.end_time for s in log_steps
            if s.end_time is not None and s.step in ends]
    return statistics.median(gaps) if len(gaps) >= MIN_SHARED else None


def shift(steps: list[StepRecord], events: list[Event], offset: float) -> None:
    """Move every time of ``steps`` and ``events`` by ``offset`` seconds, in place."""
    for s in steps:
        if s.end_time is not None:
            s.end_time += offset
    for e in events:
        if e.time is not None:
            e.time += offset


def store_steps_beside(samples_path: str | None) -> Path | None:
    """``train.jsonl`` in the folder of a samples file (where ``verl-monitor export`` writes
    both), or None."""
    if not samples_path:
        return None
    candidate = Path(samples_path).resolve().parent / "train.jsonl"
    return candidate if candidate.is_file() else None


__all__ = ["offset_by_steps", "shift", "store_steps_beside"]
