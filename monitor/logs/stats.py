"""What a log parser counts and returns: ``ParseStats``, ``ParsedLog``, ``LogReadError``."""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor.records import Event, StepRecord

Item = StepRecord | Event

#: How many unparseable lines ``ParseStats.error_samples`` keeps, and how long each may be.
MAX_ERROR_SAMPLES = 20
SAMPLE_CHARS = 200
#: The largest step number a record may carry (the store keeps steps as signed 64-bit integers).
MAX_STEP = 2**63 - 1


class LogReadError(OSError):
    """A log file that cannot be read; the message is one line naming the file."""


@dataclass
class ParseStats:
    """Counters of one parser. ``bad_utf8_lines``: lines holding U+FFFD, the mark the reader
    (``iter_lines``, ``LogFollower``) leaves where it replaced invalid UTF-8. ``oversize_lines``:
    lines ``parse_file``'s reader dropped for being longer than its limit.
    ``noise_lines`` are ordinary lines that are neither records nor events. ``error_samples`` holds the last unparseable lines, each cut to
    200 characters and prefixed with the reason (``"bad value for 'actor/lr': ..."``)."""

    lines: int = 0
    records: int = 0
    events: int = 0
    parse_errors: int = 0
    bad_utf8_lines: int = 0
    noise_lines: int = 0
    oversize_lines: int = 0
    error_samples: list[str] = field(default_factory=list)

    def add_error(self, reason: str, line: str) -> None:
        """Count one unparseable line and keep a short sample of it."""
        self.parse_errors += 1
        self.error_samples.append(f"{reason}: {line[:SAMPLE_CHARS]}")
        if len(self.error_samples) > MAX_ERROR_SAMPLES:
            del self.error_samples[:-MAX_ERROR_SAMPLES]

    def count(self, out: list[Item]) -> None:
        """Count the records and events one line (or a flush) produced."""
        for item in out:
            if isinstance(item, StepRecord):
                self.records += 1
            else:
                self.events += 1


@dataclass
class ParsedLog:
    """A whole parsed log file. ``format`` is ``"console"`` or ``"jsonl"`` (``"empty"`` when
    the file holds no text). ``side_files``: what could not be used of the files beside the
    log (its ``.arrivals`` sidecar), one line each."""

    steps: list[StepRecord]
    events: list[Event]
    version_guess: str
    stats: ParseStats
    format: str
    #: the Ray actor names of the lines' prefixes (``TaskRunner``, ``TaskRunnerV1``, ...)
    actors: frozenset[str] = frozenset()
    #: ``"absolute"`` (the log dates its steps), ``"relative"`` (times from the first step's
    #: start: no clock in the text dates them) or ``"none"`` (no steps): ``files.clock_kind``
    clock: str = "none"
    side_files: list[str] = field(default_factory=list)
    #: when the run's progress bar started (its drawing at 0), by the log's clock, or None
    run_start: float | None = None


def step_in_range(step: int) -> bool:
    """Whether a step number fits a record (0..2**63-1)."""
    return 0 <= step <= MAX_STEP


def short_number(value: int) -> str:
    """An integer for an error message, shortened when it is very long."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"
