"""Several records of one step made one step record, as verl means them.

verl logs some steps in more than one call, each printed as its own ``step:N - ...`` line (or
JSONL object) with the same N:

- the fully-async trainer prints the rollouter's ``reset_staleness`` figures
  (``fully_async/rollouter/*``) on one line, its own metrics (``timing_s/step`` and the rest) on
  another, and in some releases its ``timing_s/param_sync`` on a third;
- validation-only lines (``val-core/*``) of the step before its training line (already merged
  by the parser), and other partial calls (a timing dict logged alone).

Read as separate steps, each partial record would be a step of its own with no step time, and
a rebuilt timeline would place it a whole step earlier. ``merge_steps`` joins each run of
consecutive records with one step number (no resume between them, at most one with a step
timer) into one record: its metrics are the union (the step-timed record's value wins), its
phases are read again from them, its end time is the last measured one of the parts. A weight
sync logged in a record of its own ran outside the trainer's step timer: its seconds are added
to the step time (``total`` is then ``timing_s/step`` + that sync, no time invented), so the
step's phases and its wall time both hold it and the sync is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from monitor.logs.keys import phases_and_total, timers
from monitor.records import StepRecord

#: Timer names of a weight sync (``keys.timers`` names, ``timing_s/`` dropped).
SYNC_TIMERS: tuple[str, ...] = ("param_sync", "update_weights", "sync_rollout_weights")
#: End-time sources ranked from the weakest (rebuilt) to the strongest (stamped on the line).
_SOURCE_RANK = {"rebuilt": 0, "tqdm_end": 1, "tqdm_after": 1, "tqdm": 1, "worker": 1,
                "sidecar": 2, "arrival": 2, "line": 3}


def merge_steps(steps: list[StepRecord], version_hint: str | None = None,
                parts: dict[int, StepRecord] | None = None) -> list[StepRecord]:
    """``steps`` with each group of records of one step made one record (see the module
    docstring); the order and every other record are kept. A record without a step timer
    that another process printed a little out of turn (the rollouter's line after the next
    step's first line) joins the step-timed record of its step number within
    ``NEAR_RECORDS`` records. ``parts``, when given, is filled with ``id(record) -> the record
    it became`` for every record of ``steps``."""
    groups: list[list[StepRecord]] = []
    for rec in steps:
        if groups and _joins(groups[-1], rec):
            groups[-1].append(rec)
        else:
            groups.append([rec])
    _attach_strays(groups)
    out: list[StepRecord] = []
    for group in groups:
        if not group:
            continue
        merged = _merged(group, version_hint)
        out.append(merged)
        if parts is not None:
            parts.update((id(r), merged) for r in group)
    return out


#: How far (in groups of records) a record without a step timer may be from its step's.
NEAR_RECORDS = 3


def _attach_strays(groups: list[list[StepRecord]]) -> None:
    """Move each group with no step-timed record into a near group (``NEAR_RECORDS`` others,
    either way) of the same step number that has one. The groups not emptied are kept as a
    linked list, so the near ones are found in constant time (a scan of every earlier group
    for each stray was quadratic: 100,000 steps took more than 590 s)."""
    count = len(groups)
    prev = list(range(-1, count - 1))  # the previous / next group not emptied
    nxt = list(range(1, count + 1))
    for n, group in enumerate(groups):
        if not group or any(_has_step_timer(r) for r in group):
            continue
        step, source = group[0].step, group[0].source
        if source == "breakdown":
            continue
        before = _walk(prev, n, -1, NEAR_RECORDS)
        after = _walk(nxt, n, count, NEAR_RECORDS)
        for k in sorted(before + after, key=lambda k: abs(k - n)):
            other = groups[k]
            if (other[0].step == step and other[0].source == source
                    and any(_has_step_timer(r) for r in other)):
                other.extend(group)
                groups[n] = []
                p, q = prev[n], nxt[n]  # unlink the emptied group
                if p >= 0:
                    nxt[p] = q
                if q < count:
                    prev[q] = p
                break


def _walk(links: list[int], start: int, stop: int, steps: int) -> list[int]:
    """Up to ``steps`` indexes from ``start`` following ``links`` (until ``stop``)."""
    out: list[int] = []
    k = links[start]
    while k != stop and len(out) < steps:
        out.append(k)
        k = links[k]
    return out


def _joins(group: list[StepRecord], rec: StepRecord) -> bool:
    if rec.step != group[0].step or rec.source != group[0].source or rec.source == "breakdown":
        return False
    # two step-timed records are two runs of one step (a resume), never one step
    return not (_has_step_timer(rec) and any(_has_step_timer(r) for r in group))


def _has_step_timer(rec: StepRecord) -> bool:
    return "step" in timers(rec.metrics)


def _merged(group: list[StepRecord], version_hint: str | None) -> StepRecord:
    if len(group) == 1:
        return group[0]
    main = next((r for r in group if _has_step_timer(r)), group[-1])
    metrics: dict[str, Any] = {}
    for rec in group:
        if rec is not main:
            metrics.update(rec.metrics)
    metrics.update(main.metrics)
    phases, total = dict(main.phases), main.total
    outside = _outside_sync(group, main)
    if outside is not None:
        # a sync line's seconds the parser gave ``main`` were a sync of its own line: the
        # timer logged in the step's own record replaces them (one sync, counted once)
        given = phases.get("reshard", 0.0)
        phases["reshard"] = outside
        if total is not None:
            total += outside
            if "other" in phases:
                phases["other"] += given
    if total is None:
        phases, total = phases_and_total(metrics, version_hint=version_hint)
    end_rec = max(group, key=lambda r: (r.end_time is not None,
                                        _SOURCE_RANK.get(r.time_source, 0),
                                        r.end_time if r.end_time is not None else 0.0))
    merged = StepRecord(
        step=main.step,
        end_time=end_rec.end_time,
        total=total,
        phases=phases,
        throughput=_first(r.throughput for r in [main, *group]),
        mem_allocated_peak_bytes=_first(r.mem_allocated_peak_bytes for r in [main, *group]),
        mem_reserved_peak_bytes=_first(r.mem_reserved_peak_bytes for r in [main, *group]),
        metrics=metrics,
        time_source=end_rec.time_source,
        source=main.source,
        data_wait=main.data_wait,
    )
    for rec in group:  # a pending reshard (HybridEngine, sync line) given to a part
        if rec is not main and "reshard" in rec.phases and "reshard" not in merged.phases:
            merged.phases["reshard"] = rec.phases["reshard"]
    return merged


def _outside_sync(group: list[StepRecord], main: StepRecord) -> float | None:
    """Seconds of a weight sync logged in a record of its own (outside ``main``'s step timer),
    None when the step-timed record holds its sync itself or there is none."""
    if not _has_step_timer(main):
        return None
    own = timers(main.metrics)
    if any(name in own for name in SYNC_TIMERS):
        return None
    for rec in group:
        if rec is main:
            continue
        found = timers(rec.metrics)
        for name in SYNC_TIMERS:
            value = found.get(name)
            if value is not None and value >= 0:
                return float(value)
    return None


def _first(values: Iterable[float | None]) -> float | None:
    return next((v for v in values if v is not None), None)
