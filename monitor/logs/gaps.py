"""The time between steps that no verl timer covers: fetching the next batch.

verl's fit loop is ``for batch_dict in train_dataloader:`` and only then ``with
marked_timer("step")``, so the DataLoader's work (its workers, tokenisation, collation) and
building the generation batch happen before ``timing_s/step`` starts, in every version up to
0.9.1 (VERL_SIGNALS.md, "What no timer covers"). A data stall therefore shows in no
``timing_s/*`` key, only as wall time between two step lines beyond what the later line's
timers account for. This module measures that gap from the lines' end times (timestamps on
the lines, the times the lines arrived or were captured, tqdm's elapsed time, dated worker
lines: ``monitor.logs.clocks``); logs without any carry no such information and are left
unknown.
"""

from __future__ import annotations

from monitor.logs.clocks import RESOLUTION_S
from monitor.records import StepRecord

#: End-time sources that are measurements (not rebuilt from the step times themselves): a
#: stamp on the line, the arrival or capture time, tqdm's elapsed time, dated worker lines.
MEASURED_SOURCES = ("line", "arrival", "sidecar", "tqdm", "tqdm_end", "tqdm_after", "worker")
#: A gap smaller than this share of the step's own timers means the two end times are not
#: comparable (lines read in a burst when following starts, clocks of different hosts):
#: the wait is then unknown rather than zero.
INCONSISTENT_SHARE = 0.8
#: Seconds of slack for line-arrival jitter (the follower polls; printing is not instant).
JITTER_S = 0.05


def covered_seconds(rec: StepRecord) -> float | None:
    """Wall seconds of a step that its timers account for.

    ``timing_s/step`` excludes testing and checkpoint saving since 0.6 and includes them
    before; they are added only where the step time does not already hold them.
    """
    if rec.total is None:
        return None
    total = float(rec.total)
    extra = sum(float(rec.phases.get(p) or 0.0) for p in ("testing", "save_checkpoint"))
    if extra <= 0:
        return total
    core = sum(float(v) for k, v in rec.phases.items()
               if v is not None and k not in ("testing", "save_checkpoint", "other",
                                              "rollout_wait", "comm"))
    # the step time already holds testing/checkpoint when it exceeds the other phases by them
    return total if total - core >= 0.5 * extra else total + extra


def data_wait(prev: StepRecord | None, rec: StepRecord, scale: float = 1.0) -> float | None:
    """Seconds before ``rec``'s timer started that no timer covers, or None when unknowable.

    ``scale`` converts end-time seconds to the log's own seconds: a simulated run replayed at
    30x writes lines 30 times faster than its step times say (1 everywhere else).
    """
    if prev is None or prev.end_time is None or rec.end_time is None:
        return None
    if prev.time_source not in MEASURED_SOURCES or rec.time_source not in MEASURED_SOURCES:
        return None
    if rec.step <= prev.step:  # a resume: the previous line belongs to another run
        return None
    covered = covered_seconds(rec)
    if covered is None:
        return None
    gap = (float(rec.end_time) - float(prev.end_time)) * scale
    if gap < INCONSISTENT_SHARE * covered:
        return None
    jitter = max(JITTER_S, RESOLUTION_S.get(prev.time_source, JITTER_S),
                 RESOLUTION_S.get(rec.time_source, JITTER_S))
    return max(0.0, gap - covered - jitter)


def fill_data_wait(steps: list[StepRecord]) -> list[StepRecord]:
    """Set ``data_wait`` on each step from its predecessor in end-time order; returns ``steps``.

    Steps that already carry a value keep it (a live exporter measured it on arrival).
    """
    timed = sorted((s for s in steps if s.end_time is not None), key=lambda s: s.end_time)
    prev: StepRecord | None = None
    for rec in timed:
        if rec.data_wait is None:
            rec.data_wait = data_wait(prev, rec)
        prev = rec
    return steps


class DataWaitTracker:
    """Live form: remembers the last step seen and fills ``data_wait`` on each new one."""

    def __init__(self, scale: float = 1.0) -> None:
        self._prev: StepRecord | None = None
        self.scale = scale

    def update(self, rec: StepRecord) -> float | None:
        """Measure ``rec`` against the step before it; returns the value it set."""
        if rec.data_wait is None:
            rec.data_wait = data_wait(self._prev, rec, self.scale)
        if rec.end_time is not None:
            self._prev = rec
        return rec.data_wait
