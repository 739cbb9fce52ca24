"""The capture-time sidecar: when ``verl-monitor run`` captured each line of the job's log.

The log itself stays exactly what the job printed (other tools keep reading it); beside it,
``<log>.arrivals`` holds one ``"<offset> <unix_ts> <end>\\n"`` text line per captured line, or
per chunk of lines captured together: the byte offset in the log where that line (the chunk's
first line) starts, the unix time it was captured, and the offset where the chunk ends (older
sidecars have no ``<end>``: a chunk then ends where the next record starts, and the last one
where its step lines' timers say it must). A line starting at offset ``o`` was captured at the
time of the record whose chunk holds ``o``; a line past the last chunk (``run`` was killed
while the job went on) has no capture time. An offline ``analyze`` of the log (or an exporter started after the job)
can then give each line the time it was really printed.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from monitor.logs.safe_read import Unreadable, open_beside, read_tail
from monitor.logs.timestamps import FUTURE_SLACK_S

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
        from monitor.safe_write import open_append  # never through a link at its name

        self._fh: IO[str] | None = os.fdopen(open_append(self.path, truncate=mode == "w"),
                                             "a", encoding="ascii")
        self._last_offset = -1

    def record(self, offset: int, ts: float, end: int | None = None) -> None:
        """Record that the line starting at byte ``offset`` of the log (with the lines after
        it up to byte ``end``, when given: one chunk) was captured at ``ts``.

        Offsets that do not move forward (the same chunk recorded twice) are skipped.
        """
        if self._fh is None or offset <= self._last_offset:
            return
        self._last_offset = offset
        tail = f" {int(end)}" if end is not None and end > offset else ""
        self._fh.write(f"{int(offset)} {ts:.6f}{tail}\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the sidecar; later ``record`` calls do nothing."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _last_offset(path: Path) -> int | None:
    """The offset of the last whole record of a sidecar (read from its end), or None."""
    try:
        tail = read_tail(path, 256, os.path.dirname(os.path.abspath(path))).split(b"\n")
    except OSError:
        return None
    for line in reversed(tail[:-1]):
        parts = line.split()
        if len(parts) in (2, 3) and parts[0].isdigit():
            return int(parts[0])
    return None


def read_arrivals(log_path: str | os.PathLike[str]) -> list[tuple[int, float]] | None:
    """The ``(offset, unix_ts)`` pairs recorded for ``log_path`` with a usable time, in file
    order (for tests and small sidecars; readers of a log use :func:`capture_times`).

    None when the log has no sidecar or it cannot be read. A last line without its newline
    (torn by a kill mid-write), lines that are not records and records out of order are
    skipped."""
    times = capture_times(log_path, checked=False)
    if times is None:
        return None
    with times:
        return [(r.offset, r.ts) for r in times.records() if r.ts is not None]


def capture_times(log_path: str | os.PathLike[str], checked: bool = True
                  ) -> CaptureTimes | None:
    """The capture times of ``log_path``'s lines (:class:`CaptureTimes`), streamed from its
    sidecar; None when there is none. A sidecar that cannot be read (a FIFO, a device, a link
    out of the log's folder) gives an instance that times nothing and says why
    (``problems``). ``checked=False``: times are not held to the log's own (tests)."""
    path = sidecar_path(log_path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fh = open_beside(path, folder)
    except Unreadable as exc:
        if not os.path.lexists(path):
            return None
        return CaptureTimes(None, str(path), problems=[str(exc)])
    try:
        st = os.stat(log_path)
        size, last_write = st.st_size, st.st_mtime
    except OSError:
        size, last_write = None, None
    if not checked:
        size, last_write = None, None
    return CaptureTimes(fh, str(path), log_size=size, last_write=last_write)


#: The longest record line read (two or three numbers); longer lines are skipped unread.
MAX_RECORD_BYTES = 96
#: Sidecar bytes read at most per byte of the log: each record times at least one line of at
#: least one byte, and is at most ``MAX_RECORD_BYTES`` long.
BYTES_PER_LOG_BYTE = MAX_RECORD_BYTES
#: No capture is older than this (2000-01-01 UTC): an older time is a wrong one.
EARLIEST_CAPTURE = 946684800.0
#: A capture time may go back this much (a wall clock stepped back) before it is not used.
BACKWARDS_SLACK_S = 1.0


@dataclass
class Record:
    """One record of the sidecar: the chunk of lines from ``offset`` (to ``end``, when the
    record says; else to the next record) was captured at ``ts`` (None: a time that cannot
    be this log's, so its lines are timed as if they had no record)."""

    offset: int
    ts: float | None
    end: int | None = None


class CaptureTimes:
    """The capture time of each line of one log, read from its sidecar as the log is read
    (the sidecar is streamed, the log is never held): :meth:`at` with the line's start offset,
    in increasing order.

    What it cannot use is skipped and said (``problems``, once each): records out of order
    (an offset not after the one before), times that no capture of this log can have (not
    finite, before 2000, after the log's last write, or going back),
    bytes past what a sidecar of this log can hold. A sidecar that ends before the log (``run``
    was killed, or exited while a grandchild still wrote) times the lines it covers only: the
    later ones get no time (None) and are timed by the log's other clocks. An older sidecar's
    last record says no chunk end: it times every later line (``open_ts``), and the reader
    keeps only what the step timers allow (``files.parse_file``).
    """

    def __init__(self, fh: BinaryIO | None, path: str, *, log_size: int | None = None,
                 last_write: float | None = None, problems: list[str] | None = None) -> None:
        self.path = path
        self._fh = fh
        self._size = log_size
        if last_write is None:
            self._lo, self._hi = -math.inf, math.inf
        else:
            self._lo, self._hi = EARLIEST_CAPTURE, last_write + FUTURE_SLACK_S
        self._budget = (BYTES_PER_LOG_BYTE * log_size + 4096 if log_size is not None
                        else math.inf)
        self._said = list(problems or [])
        self._counts: Counter[str] = Counter()
        self._samples: dict[str, str] = {}
        self._records: Iterator[Record] | None = None
        self._cur: Record | None = None
        self._next: Record | None = None
        self._ended_at: int | None = None
        #: the time of an older sidecar's last record (no chunk end) when it timed lines past
        #: its first: how far that chunk went is not known (see ``files.parse_file``)
        self.open_ts: float | None = None

    def __enter__(self) -> CaptureTimes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the sidecar."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def at(self, offset: int) -> float | None:
        """The capture time of the line starting at byte ``offset`` of the log (offsets asked
        in increasing order): the time of the record whose chunk holds it; None before the
        first record, in a gap, past the sidecar's end, or for a record not used."""
        if self._records is None:
            self._records = self.records()
            self._next = next(self._records, None)
        while self._next is not None and self._next.offset <= offset:
            self._cur, self._next = self._next, next(self._records, None)
        cur = self._cur
        if cur is None:
            return None
        if cur.end is None and self._next is None:  # an older sidecar's last record
            if offset > cur.offset:
                self.open_ts = cur.ts
            return cur.ts
        end = cur.end if cur.end is not None else self._next.offset  # type: ignore[union-attr]
        if offset >= end:
            if self._next is None and self._ended_at is None and cur.ts is not None:
                self._ended_at = end
            return None
        return cur.ts

    def records(self) -> Iterator[Record]:
        """The sidecar's records in file order, each checked (see the class docstring)."""
        last: Record | None = None
        last_ts: float | None = None
        for raw in self._lines():
            rec = self._parse(raw)
            if rec is None:
                continue
            if self._size is not None and rec.offset >= self._size:
                return  # past the log's end: another log's, or the log was cut since
            if last is not None and (rec.offset <= last.offset or (
                    last.end is not None and rec.offset < last.end)):
                self._skip("out of order (an offset not after the record before)", raw)
                continue
            if rec.ts is not None and last_ts is not None and rec.ts < last_ts - BACKWARDS_SLACK_S:
                self._skip("a time before the record before", raw)
                rec.ts = None
            if rec.ts is not None:
                last_ts = rec.ts
            last = rec
            yield rec

    def _parse(self, raw: bytes) -> Record | None:
        parts = raw.split()
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[::2]):
            return None
        try:
            ts = float(parts[1])
        except ValueError:
            return None
        offset = int(parts[0])
        end = int(parts[2]) if len(parts) == 3 else None
        if end is not None and end <= offset:
            end = None
        if self._size is not None and end is not None:
            end = min(end, self._size)
        if not (math.isfinite(ts) and self._lo <= ts <= self._hi):
            self._skip("a time no capture of this log can have", raw)
            return Record(offset, None, end)
        return Record(offset, ts, end)

    def _lines(self) -> Iterator[bytes]:
        """The sidecar's whole lines (a torn last line is not one), lines over
        ``MAX_RECORD_BYTES`` skipped unread, up to the byte budget."""
        fh = self._fh
        if fh is None:
            return
        read = 0
        while True:
            raw = fh.readline(MAX_RECORD_BYTES + 1)
            if not raw:
                return
            read += len(raw)
            whole = raw.endswith(b"\n")
            if not whole and len(raw) <= MAX_RECORD_BYTES:
                return  # torn by a kill mid-write
            while not whole and read <= self._budget:  # an overlong line: skip its rest
                piece = fh.readline(1 << 16)
                read += len(piece)
                whole = not piece or piece.endswith(b"\n")
            if read > self._budget:
                self._said.append(f"{self.path}: read only its first {int(self._budget):,} "
                                  "bytes (more than a capture of this log can hold)")
                return
            if len(raw) <= MAX_RECORD_BYTES:
                yield raw

    def _skip(self, why: str, raw: bytes) -> None:
        self._counts[why] += 1
        self._samples.setdefault(why, raw.decode("ascii", "replace").strip()[:60])

    @property
    def problems(self) -> list[str]:
        """What was not used, in words (one line each): unreadable, records skipped by
        reason (with the first one)."""
        out = list(self._said)
        for why, n in self._counts.items():
            out.append(f"{self.path}: {n} record{'s' if n != 1 else ''} not used: {why} "
                       f"(first: {self._samples[why]!r})")
        return out

    @property
    def ended(self) -> str | None:
        """Where the capture times end before the lines asked for do, in words (a whole log
        read: ``run`` was killed, or exited while the job went on), else None. Not a problem
        while the log is followed live (``run`` captures the newest lines a moment later)."""
        if self._ended_at is None or self._size is None:
            return None
        return (f"{self.path}: capture times end at byte {self._ended_at:,} of the log's "
                f"{self._size:,}; later lines are timed by the log's other clocks")


class ArrivalTail:
    """Reads a sidecar as it grows (a live exporter beside ``verl-monitor run``, or the
    simulator): each ``times`` call reads only the records appended since the last one, so a
    followed log's lines get the time they were captured, not the time the exporter's poll
    happened to read them (up to one interval later). Records are read as
    :class:`CaptureTimes` reads them (two or three fields); one out of order is skipped."""

    def __init__(self, log_path: str | os.PathLike[str]) -> None:
        self.path = sidecar_path(log_path)
        self._parser = CaptureTimes(None, str(self.path))
        self._read = 0  # bytes of the sidecar consumed (whole lines only)
        self._offsets: list[int] = []
        self._times: list[float | None] = []

    def _poll(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            with open_beside(self.path, folder) as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self._read:  # rewritten (a new job's log): read it again
                    self._read, self._offsets, self._times = 0, [], []
                fh.seek(self._read)
                chunk = fh.read(max(0, min(size - self._read, 1 << 24)))
        except (OSError, Unreadable):
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        self._read += end + 1
        for raw in chunk[:end].split(b"\n"):
            rec = self._parser._parse(raw) if len(raw) <= MAX_RECORD_BYTES else None
            if rec is None or (self._offsets and rec.offset <= self._offsets[-1]):
                continue  # not a record, or out of order: the file's order holds
            self._offsets.append(rec.offset)
            self._times.append(rec.ts)

    def times(self, starts: list[int | None]) -> list[float | None] | None:
        """The capture time of each line starting at ``starts`` (byte offsets in the log):
        the time of the last record at or before it; None for a line no record covers (or
        whose start is unknown). None when there is no sidecar. Records long before the lines
        asked about are let go (the lines are read in order)."""
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
