"""Several logs of one job as one record: ``verl-monitor analyze attempt1.log attempt2.log``.

Each log's steps and events are kept as they are; each log brings its attempts' starts and
exits: those ``verl-monitor run`` wrote beside it (``<log>.attempts``), else one attempt
from its first line (its first capture time or timestamp, else its first step or event) to its last
(``monitor.logs.attempt_marks.file_marks``). The attempt ledger
(``monitor.analysis.attempts``) then books the job across them.
"""

from __future__ import annotations

from collections.abc import Iterable

from monitor.logs.attempt_marks import file_marks, first_line_time, read_marks
from monitor.logs.stats import ParsedLog
from monitor.records import Event, StepRecord


def log_marks(path: str, parsed: ParsedLog) -> list[Event]:
    """The attempt marks of one log: its ``.attempts`` file, else the log as one attempt."""
    return read_marks(path) or file_marks(path, parsed.steps, parsed.events,
                                          first_line_time(path))


def join_logs(logs: Iterable[tuple[str, ParsedLog]]) -> tuple[list[StepRecord], list[Event]]:
    """The steps and events of every log, with each log's attempt marks, in time order."""
    steps: list[StepRecord] = []
    events: list[Event] = []
    for path, parsed in logs:
        steps += parsed.steps
        events += parsed.events + log_marks(str(path), parsed)
    steps.sort(key=lambda s: (s.end_time is None, s.end_time or 0.0))
    events.sort(key=lambda e: (e.time is None, e.time or 0.0))
    return steps, events
