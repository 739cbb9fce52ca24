"""The capture-time sidecar: when ``verl-monitor run`` captured each line of the job's log.

The log itself stays exactly what the job printed (other tools keep reading it); beside it,
``<log>.arrivals`` holds one ``"<offset> <unix_ts>\\n"`` text line per captured line, or per
chunk of lines captured together: the byte offset in the log where that line (the chunk's
first line) starts, and the unix time it was captured. A line starting at offset ``o`` was
captured at the time of the last record whose offset is ``o`` or less. An offline
``analyze`` of the log (or an exporter started after the job) can then give each line the
time it was really printed.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import IO

SUFFIX = ".arrivals"


def sidecar_path(log_path: str | os.PathLike[str]) -> Path:
    """Where the capture times of ``log_path`` are kept: ``<log>.arrivals`` beside it."""
    p = Path(log_path)
    return p.with_name(p.name + SUFFIX)


class ArrivalWriter:
    """Appends capture times to the sidecar of one log, one line per ``record`` call.

    Each line is written and flushed at once, so a reader (or a ``kill -9`` of the writer)
    sees every record made so far except, at worst, a torn last line.
    """

    def __init__(self, log_path: str | os.PathLike[str]) -> None:
        """Open (append) the sidecar of ``log_path``; raises ``OSError`` if it cannot be.

        A sidecar whose last record lies past the end of the log (the log was truncated or
        replaced since) describes other bytes: it is emptied first."""
        self.path = sidecar_path(log_path)
        mode = "a"
        last = _last_offset(self.path)
        if last is not None:
            try:
                size = os.stat(log_path).st_size
            except OSError:
                size = 0
            if last >= size:
                mode = "w"
        self._fh: IO[str] | None = open(self.path, mode, encoding="ascii")  # noqa: SIM115
        self._last_offset = -1

    def record(self, offset: int, ts: float) -> None:
        """Record that the line starting at byte ``offset`` of the log was captured at ``ts``.

        Offsets that do not move forward (the same chunk recorded twice) are skipped.
        """
        if self._fh is None or offset <= self._last_offset:
            return
        self._last_offset = offset
        self._fh.write(f"{int(offset)} {ts:.6f}\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the sidecar; later ``record`` calls do nothing."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _last_offset(path: Path) -> int | None:
    """The offset of the last whole record of a sidecar (read from its end), or None."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 256))
            tail = fh.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(tail[:-1]):
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            return int(parts[0])
    return None


def read_arrivals(log_path: str | os.PathLike[str]) -> list[tuple[int, float]] | None:
    """The ``(offset, unix_ts)`` pairs recorded for ``log_path``, in file order.

    None when the log has no sidecar (or it cannot be read). A last line without its newline
    (torn by a kill mid-write) and lines that are not two numbers are skipped.
    """
    try:
        text = sidecar_path(log_path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    lines = text.split("\n")
    lines.pop()  # what follows the last newline: empty, or a line torn mid-write
    return [rec for rec in map(_record, lines) if rec is not None]


def _record(line: str | bytes) -> tuple[int, float] | None:
    """``(offset, unix_ts)`` of one sidecar line; None for a line that is not two numbers
    (or a negative offset, or a time that is NaN)."""
    parts = line.split()
    if len(parts) != 2:
        return None
    try:
        offset, ts = int(parts[0]), float(parts[1])
    except ValueError:
        return None
    return (offset, ts) if offset >= 0 and ts == ts else None


class ArrivalTail:
    """Reads a sidecar as it grows (a live exporter beside ``verl-monitor run``, or the
    simulator): each ``times`` call reads only what was appended since the last one, so a
    followed log's lines get the time they were captured, not the time the exporter's poll
    happened to read them (up to one interval later)."""

    def __init__(self, log_path: str | os.PathLike[str]) -> None:
        self.path = sidecar_path(log_path)
        self._read = 0  # bytes of the sidecar consumed (whole lines only)
        self._offsets: list[int] = []
        self._times: list[float] = []

    def _poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self._read:  # rewritten (a new job's log): read it again
                    self._read, self._offsets, self._times = 0, [], []
                fh.seek(self._read)
                chunk = fh.read()
        except OSError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        self._read += end + 1
        for line in chunk[:end].split(b"\n"):
            rec = _record(line)
            if rec is None:
                continue
            offset, ts = rec
            if self._offsets and offset <= self._offsets[-1]:
                continue  # out of order: another writer's; keep the file order
            self._offsets.append(offset)
            self._times.append(ts)

    def times(self, starts: list[int | None]) -> list[float | None] | None:
        """The capture time of each line starting at ``starts`` (byte offsets in the log):
        the time of the last record at or before it; None for a line no record covers (or
        whose start is unknown). None when there is no sidecar. Records before the first
        line asked about are let go (the lines are read in order)."""
        self._poll()
        if not self._offsets:
            return None
        out: list[float | None] = []
        for start in starts:
            k = -1 if start is None else bisect.bisect_right(self._offsets, start) - 1
            out.append(self._times[k] if k >= 0 else None)
        known = [s for s in starts if s is not None]
        if known:
            keep = max(bisect.bisect_right(self._offsets, min(known)) - 1, 0)
            if keep > 1024:
                del self._offsets[:keep], self._times[:keep]
        return out
