"""A finished run is finished: when it ended, from the log or from the wrapper.

Three signs, any one enough:

- verl's end of training in the log: the last tqdm line reaching its total
  (``Training Progress: 100%|...| N/N``) or the ``Final validation metrics:`` block
  (:func:`finish_time`), with no step after it (a new run appended to the log is not finished);
- the job's exit, seen by ``verl-monitor run`` (or the simulator's end): it writes a marker file
  beside the log, ``<log>.exit`` (:func:`mark_exit`), which the exporter reads
  (:func:`read_exit`); a marker older than the log's newest step is a previous run's.

The exporter then closes the run's open flags as "run finished" and opens nothing new
(``FlagTracker.finish``); the ``hang`` and ``stalled`` detectors never count a silence that
starts at the run's end.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from monitor.logs.safe_read import Unreadable, note, read_capped
from monitor.logs.timestamps import FUTURE_SLACK_S
from monitor.records import Event, StepRecord

#: Suffix of the marker ``verl-monitor run`` writes beside the log when the job exits.
EXIT_SUFFIX = ".exit"
#: The largest marker read: ``mark_exit`` writes a few dozen bytes.
MAX_EXIT_BYTES = 4096
#: A progress line or final validation this close after the last step's end still ends it.
SLACK_S = 1.0


def exit_marker(log: str | Path) -> Path:
    """The marker file beside ``log``."""
    return Path(str(log) + EXIT_SUFFIX)


def mark_exit(log: str | Path, status: int, when: float | None = None) -> None:
    """Say that the job writing ``log`` exited with ``status`` (best effort: never raises).
    The marker is created anew, never through a link planted at its name
    (``monitor.safe_write.create_new_file``)."""
    from monitor.safe_write import create_new_file

    try:
        create_new_file(exit_marker(log), json.dumps({"time": when or time.time(),
                                                      "status": int(status)}))
    except OSError:
        pass


def clear_exit(log: str | Path) -> None:
    """Remove a previous run's marker (a job starts)."""
    try:
        exit_marker(log).unlink(missing_ok=True)
    except OSError:
        pass


def read_exit(log: str | Path) -> tuple[float, int] | None:
    """(when, exit status) from the marker beside ``log``, or None (none, or unreadable). The
    marker is read like the log (``monitor.logs.safe_read``): a FIFO, a device, a link out of
    the log's folder or a file over ``MAX_EXIT_BYTES`` is not read, said once and counted."""
    path = exit_marker(log)
    try:
        raw = read_capped(path, MAX_EXIT_BYTES, os.path.dirname(os.path.abspath(path)))
    except Unreadable as exc:
        if os.path.lexists(path):
            note(exc, log)
        return None
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
        return float(data["time"]), int(data.get("status", 0))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None


def finish_time(events: Iterable[Event], steps: Iterable[StepRecord] = ()
                ) -> tuple[float, str] | None:
    """(when, what said so) for verl's end of training in the log, or None.

    The newest progress line at its total, or the final validation block; None when a step
    ended after it (the log goes on with another run)."""
    best: tuple[float, str] | None = None
    for e in events:
        if e.time is None:
            continue
        t = float(e.time)
        d = e.data or {}
        said = ""
        if e.kind == "progress" and d.get("total") and d.get("current", 0) >= d["total"] > 0:
            said = f"the last progress line ({d['current']}/{d['total']})"
        elif e.kind == "validation" and d.get("origin") == "final_block":
            said = "the final validation"
        if said and (best is None or t > best[0]):
            best = (t, said)
    if best is None:
        return None
    last_end = max((float(s.end_time) for s in steps if s.end_time is not None), default=None)
    if last_end is not None and last_end > best[0] + SLACK_S:
        return None
    return best


def exit_after_steps(log_paths: Iterable[str | Path], steps: Iterable[StepRecord],
                     now: float | None = None) -> tuple[float, str] | None:
    """(when, words) for an exit marker beside one of the logs that is not older than the
    newest step (a previous run's marker is ignored), else None. A marker dated after ``now``
    (default: the clock) or not a finite time is not an exit: no flag is closed by it (it is
    said once and counted)."""
    last_end = max((float(s.end_time) for s in steps if s.end_time is not None), default=0.0)
    now = time.time() if now is None else now
    for log in log_paths:
        got = read_exit(log)
        if got is None:
            continue
        if not math.isfinite(got[0]) or got[0] > now + FUTURE_SLACK_S:
            note(f"{exit_marker(log)}: dated {got[0]:g}, after now: not the job's exit; "
                 "the run is not taken as finished", log)
            continue
        if got[0] >= last_end - SLACK_S:
            return got[0], f"the job exited with status {got[1]}"
    return None
