"""Run statistics over step records and events: pure functions, shared by ``analyze`` and the
dashboards.

- ``phase_table(steps)``: per canonical phase, mean / p50 / p95 / max seconds and share of step
  time.
- ``summarize(steps, events)``: everything the text report prints, as a JSON-safe dict (NaN
  becomes None): steps seen, step time, phases, throughput and its trend, reshard statistics
  and spikes, rollout long tail, data-parallel token imbalance, memory peaks, events.

Every function accepts an empty list and returns "nothing known" values rather than raising.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from monitor.logs.clocks import DATED, MEASURED
from monitor.logs.gaps import covered_seconds, fill_data_wait
from monitor.numbers import finite_float as _finite
from monitor.records import ALL_PHASES, Event, StepRecord

PHASE_TABLE_COLUMNS: tuple[str, ...] = ("steps", "mean", "p50", "p95", "max", "sum", "share")
#: The phase-table row of wall time between steps that no timer covers.
BETWEEN_STEPS = "between_steps"

#: Long-tail sources, in order of preference: (label, numerator keys, denominator key).
_LONG_TAIL_SOURCES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "agent_loop",
        (
            "timing_s/agent_loop/slowest/generate_sequences",
            "timing_s/agent_loop/generate_sequences/max",
        ),
        "timing_s/agent_loop/generate_sequences/mean",
    ),
    ("response_length", ("response_length/max",), "response_length/mean"),
)

#: Event kinds listed one by one in the summary (others are only counted).
LISTED_EVENTS: tuple[str, ...] = ("oom", "traceback", "resume", "checkpoint_load", "truncated")
MAX_LISTED = 20
MESSAGE_CHARS = 200


def json_safe(value: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def _stats(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """count, mean, p50, p95, max, min of the finite values (None when there are none)."""
    arr = np.array([v for v in (_finite(x) for x in values) if v is not None], dtype=float)
    if arr.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "max": None, "min": None}
    return {
        "count": int(arr.size),
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
        "min": float(arr.min()),
    }


def phase_table(steps: Sequence[StepRecord], wall_s: float | None = None) -> pd.DataFrame:
    """Per phase (index, in ``ALL_PHASES`` order, only phases seen): steps, mean, p50, p95,
    max, sum (seconds) and share (0..1).

    The shares are of the wall time: ``wall_s`` (the run's measured span, ``wall_time``) or,
    without it, the time the steps' timers cover (validation and checkpointing outside verl's
    step timer included). Wall time no timer covers is the row ``between_steps`` (the batch
    fetch before the step timer, restarts, what the log does not say), so the column adds up to
    1. With no step time at all the shares are of the sum of the phase seconds.
    """
    rows = []
    with_total = [s for s in steps if _finite(s.total) is not None]
    covered_sum = sum(covered_seconds(s) or 0.0 for s in with_total)
    if covered_sum <= 0:
        with_total = list(steps)
        covered_sum = sum(
            v for s in steps for v in (_finite(x) for x in s.phases.values()) if v is not None
        )
    wall = _finite(wall_s)
    denominator = max(covered_sum, wall) if wall is not None and covered_sum > 0 else covered_sum
    for phase in ALL_PHASES:
        values = [_finite(s.phases.get(phase)) for s in steps if phase in s.phases]
        values = [v for v in values if v is not None]
        if not values:
            continue
        arr = np.array(values, dtype=float)
        share_sum = sum(
            v for s in with_total for v in [_finite(s.phases.get(phase))] if v is not None
        )
        rows.append(_phase_row(phase, arr, share_sum / denominator if denominator > 0
                               else float("nan")))
    if denominator > covered_sum > 0:
        rest = denominator - covered_sum
        rows.append({"phase": BETWEEN_STEPS, "steps": len(with_total),
                     "mean": rest / max(1, len(with_total)), "p50": None, "p95": None,
                     "max": None, "sum": rest, "share": rest / denominator})
    df = pd.DataFrame(rows, columns=["phase", *PHASE_TABLE_COLUMNS])
    return df.set_index("phase")


def _phase_row(phase: str, arr: np.ndarray, share: float) -> dict[str, Any]:
    return {"phase": phase, "steps": int(arr.size), "mean": float(arr.mean()),
            "p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)),
            "max": float(arr.max()), "sum": float(arr.sum()), "share": share}


def step_overview(steps: Sequence[StepRecord], events: Sequence[Event] = ()) -> dict[str, Any]:
    """Steps seen: count, first/last step number, distinct steps, resumes, time span, sources."""
    if not steps:
        return {"count": 0, "first": None, "last": None, "distinct": 0,
                "resumes": sum(1 for e in events if e.kind == "resume"),
                "start_time": None, "end_time": None, "time_sources": {}, "formats": {}}
    numbers = [s.step for s in steps]
    backwards = sum(1 for a, b in zip(numbers, numbers[1:], strict=False) if b < a)
    resume_events = sum(1 for e in events if e.kind == "resume")
    ends = [e for e in (_finite(s.end_time) for s in steps) if e is not None]
    first = steps[0]
    start = None
    if ends:
        start = min(ends)
        if first.end_time is not None and _finite(first.total) is not None:
            start = min(start, float(first.end_time) - (covered_seconds(first) or 0.0))
    return {
        "count": len(steps),
        "first": numbers[0],
        "last": numbers[-1],
        "distinct": len(set(numbers)),
        "resumes": max(backwards, resume_events),
        "start_time": start,
        "end_time": max(ends) if ends else None,
        "time_sources": dict(Counter(s.time_source for s in steps)),
        "formats": dict(Counter(s.source for s in steps)),
    }


def throughput_stats(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """Tokens/s per GPU (verl's ``perf/throughput``): stats, and the first vs last quarter.

    ``trend`` is last-quarter mean / first-quarter mean - 1 (-0.2 = 20 % slower), given when at
    least 4 steps report throughput.
    """
    values = [v for v in (_finite(s.throughput) for s in steps) if v is not None]
    out: dict[str, Any] = dict(_stats(values))
    out.update({"first_quarter": None, "last_quarter": None, "trend": None})
    if len(values) >= 4:
        q = len(values) // 4
        first = float(np.mean(values[:q]))
        last = float(np.mean(values[-q:]))
        out.update({"first_quarter": first, "last_quarter": last})
        if first > 0:
            out["trend"] = last / first - 1.0
    return out


def reshard_stats(
    steps: Sequence[StepRecord],
    *,
    window: int = 10,
    factor: float = 2.0,
    min_excess_s: float = 0.5,
) -> dict[str, Any]:
    """Weight-sync (``reshard``) seconds: median, p95, max, and spikes.

    A spike is a step whose reshard is more than ``factor`` times the rolling median of the
    ``window`` steps before it and at least ``min_excess_s`` above it (needs 3 earlier steps).
    """
    pairs = [(s.step, _finite(s.phases.get("reshard"))) for s in steps if "reshard" in s.phases]
    pairs = [(n, v) for n, v in pairs if v is not None]
    base = _stats(v for _, v in pairs)
    out: dict[str, Any] = {
        "count": base["count"],
        "median": base["p50"],
        "p95": base["p95"],
        "max": base["max"],
        "mean": base["mean"],
        "spikes": [],
        "spike_count": 0,
    }
    if len(pairs) < 4:
        return out
    series = pd.Series([v for _, v in pairs], dtype=float)
    rolling = series.shift(1).rolling(window, min_periods=3).median()
    spikes = []
    for (step, value), med in zip(pairs, rolling, strict=True):
        if med is None or not math.isfinite(med):
            continue
        if value > factor * med and value - med >= min_excess_s:
            spikes.append({"step": step, "seconds": value, "rolling_median": float(med)})
    out["spike_count"] = len(spikes)
    out["spikes"] = spikes[:MAX_LISTED]
    return out


def long_tail_stats(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """Rollout long tail per step: slowest / mean agent-loop ``generate_sequences`` time, or,
    without agent-loop timers, ``response_length/max`` / ``response_length/mean``."""
    for label, numerators, denominator in _LONG_TAIL_SOURCES:
        ratios = []
        for s in steps:
            den = _finite(s.metrics.get(denominator))
            num = next(
                (v for v in (_finite(s.metrics.get(k)) for k in numerators) if v is not None),
                None,
            )
            if num is not None and den is not None and den > 0:
                ratios.append(num / den)
        if ratios:
            st = _stats(ratios)
            return {"source": label, "count": st["count"], "median": st["p50"],
                    "p95": st["p95"], "max": st["max"], "last": ratios[-1]}
    return {"source": None, "count": 0, "median": None, "p95": None, "max": None, "last": None}


def dp_imbalance_stats(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """Data-parallel token imbalance per step: ``global_seqlen/minmax_diff / global_seqlen/mean``."""
    ratios = []
    for s in steps:
        diff = _finite(s.metrics.get("global_seqlen/minmax_diff"))
        mean = _finite(s.metrics.get("global_seqlen/mean"))
        if diff is not None and mean is not None and mean > 0:
            ratios.append(diff / mean)
    st = _stats(ratios)
    return {"count": st["count"], "mean": st["mean"], "median": st["p50"], "max": st["max"],
            "last": ratios[-1] if ratios else None}


def memory_stats(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """Peak allocated / reserved GPU memory over the run (bytes), from verl's perf keys."""
    alloc = [v for v in (_finite(s.mem_allocated_peak_bytes) for s in steps) if v is not None]
    res = [v for v in (_finite(s.mem_reserved_peak_bytes) for s in steps) if v is not None]
    return {
        "allocated_peak_bytes": max(alloc) if alloc else None,
        "reserved_peak_bytes": max(res) if res else None,
    }


def event_summary(events: Sequence[Event]) -> dict[str, Any]:
    """Counts by kind, plus the first lines of OOMs, tracebacks, resumes and the like."""
    counts = Counter(e.kind for e in events)
    listed = []
    for e in events:
        if e.kind not in LISTED_EVENTS:
            continue
        line = (e.message or "").strip().splitlines()
        listed.append(
            {"kind": e.kind, "step": e.step, "time": e.time,
             "message": (line[-1] if e.kind == "traceback" and line else
                         (line[0] if line else ""))[:MESSAGE_CHARS]}
        )
    return {"counts": dict(counts), "listed": listed[:MAX_LISTED], "listed_total": len(listed)}


def wall_time(steps: Sequence[StepRecord], run_start: float | None = None) -> dict[str, Any]:
    """Where the run's wall time went between its first step's start and its last step's end
    (one step's own timers, for a run of one step).

    ``steps_s`` is what the steps' timers hold (validation, checkpointing and a weight sync
    outside verl's step timer included: ``gaps.covered_seconds``); ``data_wait_s`` the time
    before step timers that no timer covers (the batch fetch, see ``monitor.logs.gaps``),
    known only for steps whose end times are measured; ``other_s`` the rest (restarts,
    unknown). ``clock`` names where the end times came from (``clocks.CLOCK_WORDS``: the most
    used source), ``measured`` whether their spacing is measured rather than rebuilt, and
    ``dated`` whether their dates are too (tqdm placed at the log's end is measured, not dated).
    ``run_start``: when the run's progress bar started (``ParsedLog.run_start``); the wall then
    starts there when that is earlier, the time before the first step's timer (its batch
    fetch) counted as waiting before it.
    """
    fill_data_wait(list(steps))
    timed = sorted((s for s in steps if _finite(s.end_time) is not None),
                   key=lambda s: float(s.end_time))  # type: ignore[arg-type]
    sources = Counter(s.time_source for s in timed)
    clock = sources.most_common(1)[0][0] if sources else None
    if not timed:
        return {"span_s": None, "steps_s": None, "data_wait_s": None, "other_s": None,
                "data_wait_steps": 0, "data_wait_max_s": None, "data_wait_max_step": None,
                "clock": clock, "measured": clock in MEASURED, "dated": clock in DATED}
    first = timed[0]
    start = float(first.end_time) - (covered_seconds(first) or 0.0)  # type: ignore[arg-type]
    before = 0.0
    if run_start is not None and 0.0 < start - run_start and clock in MEASURED:
        before, start = start - run_start, run_start
    span = float(timed[-1].end_time) - start  # type: ignore[arg-type]
    steps_s = float(sum(covered_seconds(s) or 0.0 for s in timed))
    waits = [(s.step, float(s.data_wait)) for s in timed if _finite(s.data_wait) is not None]
    if before > 0 and first.data_wait is None:
        waits.insert(0, (first.step, before))
    wait_s = float(sum(w for _, w in waits)) if waits else None
    top = max(waits, key=lambda x: x[1]) if waits else (None, None)
    return {"span_s": span, "start": start, "steps_s": steps_s, "data_wait_s": wait_s,
            "other_s": None if wait_s is None else max(0.0, span - steps_s - wait_s),
            "data_wait_steps": len(waits), "data_wait_max_s": top[1],
            "data_wait_max_step": top[0], "clock": clock, "measured": clock in MEASURED,
            "dated": clock in DATED}


def summarize(steps: Sequence[StepRecord], events: Sequence[Event] = (),
              run_start: float | None = None) -> dict[str, Any]:
    """Every number of the text report, as a JSON-safe dict (see the module docstring);
    ``run_start``: when the run's progress bar started (``wall_time``)."""
    wall = wall_time(steps, run_start)
    table = phase_table(steps, wall["span_s"] if wall["measured"] else None)
    phases = table.reset_index().to_dict("records")
    for row in phases:
        row["steps"] = int(row["steps"])
    step_time = _stats(s.total for s in steps)
    if step_time["count"] and step_time["mean"]:
        totals = [v for v in (_finite(s.total) for s in steps) if v is not None]
        step_time["cv"] = float(np.std(totals) / step_time["mean"]) if len(totals) > 1 else 0.0
    else:
        step_time["cv"] = None
    return json_safe(
        {
            "steps": step_overview(steps, events),
            "wall": wall,
            "step_time": step_time,
            "phases": phases,
            "throughput": throughput_stats(steps),
            "reshard": reshard_stats(steps),
            "long_tail": long_tail_stats(steps),
            "dp_imbalance": dp_imbalance_stats(steps),
            "memory": memory_stats(steps),
            "events": event_summary(events),
        }
    )
