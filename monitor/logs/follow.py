"""Read log files as lines: whole files streamed (``iter_lines``) and live files followed with
``tail -F`` semantics (``LogFollower``).

Both read in chunks (never a whole file at once), decode UTF-8 with replacement (counting the
lines that needed it) and drop lines longer than ``max_line_bytes`` without holding them.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from monitor.records import Event

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 16 * 2**20
#: Bytes at the start of a followed file remembered to notice it was rewritten from scratch.
HEAD_BYTES = 64


class _Splitter:
    """Cuts a byte stream into lines; holds the partial last line; drops oversize lines."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.buf = bytearray()
        self.dropping = False
        self.oversize = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """Complete lines (without ``\\n``) that ``chunk`` finishes."""
        parts = chunk.split(b"\n")
        tail = parts.pop()
        if parts:
            if self.dropping:
                del parts[0]
                self.dropping = False
            elif self.buf:
                self.buf += parts[0]
                parts[0] = bytes(self.buf)
            self.buf = bytearray()
            limit = self.max_line_bytes
            if len(chunk) > limit or (parts and len(parts[0]) > limit):
                kept = [p for p in parts if len(p) <= limit]
                self.oversize += len(parts) - len(kept)
                parts = kept
        if not self.dropping and tail:
            self.buf += tail
            if len(self.buf) > self.max_line_bytes:
                self.buf = bytearray()
                self.dropping = True
                self.oversize += 1
        return parts

    def take_partial(self) -> bytes | None:
        """The held partial line (at the end of a file), or None; the buffer is emptied."""
        if self.dropping:
            self.dropping = False
            return None
        if not self.buf:
            return None
        data = bytes(self.buf)
        self.buf = bytearray()
        return data

    def reset(self) -> None:
        """Forget the partial line (the file started over)."""
        self.buf = bytearray()
        self.dropping = False


def _decode(raw: bytes, counter: Any) -> str:
    """UTF-8 text of one line; invalid bytes are replaced and ``counter.bad_utf8_lines`` grows."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        if counter is not None:
            counter.bad_utf8_lines += 1
    if text.endswith("\r"):
        text = text[:-1]
    return text


def iter_lines(
    path: str | os.PathLike[str],
    *,
    stats: Any = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[str]:
    """Yield the lines of a file, streaming it in chunks; the last line may lack a newline.

    ``stats`` (any object with a ``bad_utf8_lines`` counter, such as ``ParseStats``) counts the
    lines whose invalid UTF-8 was replaced. Lines above ``max_line_bytes`` are skipped. Raises
    ``OSError`` when the file cannot be opened or read.
    """
    pending: list[bytes] = []  # pieces of the line in progress
    pending_len = 0
    dropping = False  # inside a line above max_line_bytes
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(chunk_bytes)
            if not chunk:
                break
            cut = chunk.rfind(b"\n")
            if cut < 0:
                if not dropping:
                    pending.append(chunk)
                    pending_len += len(chunk)
                    if pending_len > max_line_bytes:
                        pending, pending_len, dropping = [], 0, True
                        if stats is not None and hasattr(stats, "oversize_lines"):
                            stats.oversize_lines += 1
                continue
            head = chunk[:cut]
            if dropping:
                nl = head.find(b"\n")
                dropping = False
                if nl < 0:
                    pending, pending_len = [chunk[cut + 1 :]], len(chunk) - cut - 1
                    continue
                head = head[nl + 1 :]
            elif pending:
                pending.append(head)
                head = b"".join(pending)
            pending, pending_len = [chunk[cut + 1 :]], len(chunk) - cut - 1
            # Decode the chunk's complete lines at once, then split the text (fast path).
            try:
                lines = head.decode("utf-8").split("\n")
            except UnicodeDecodeError:
                lines = [_decode(raw, stats) for raw in head.split(b"\n")]
            if len(head) > max_line_bytes:
                kept = [
                    line for line in lines if len(line.encode("utf-8", "replace")) <= max_line_bytes
                ]
                if stats is not None and hasattr(stats, "oversize_lines"):
                    stats.oversize_lines += len(lines) - len(kept)
                lines = kept
            for line in lines:
                yield line[:-1] if line.endswith("\r") else line
    if not dropping and pending_len:
        yield _decode(b"".join(pending), stats)


class LogFollower:
    """Follow a growing log file like ``tail -F``.

    ``poll()`` returns the complete lines written since the last poll (a partial last line is
    held until its newline arrives). It follows rename-rotation (finishing the old file first),
    starts over when the file shrinks (copy-truncate, verl's file logger truncating on resume),
    when its first 64 bytes change (truncated and regrown past our position between two polls)
    or when it is deleted and re-created, emitting a ``"truncated"`` event (``drain_events``),
    and waits quietly while the file is missing. Counters: ``lines``, ``bytes_read``, ``rotations``,
    ``truncations``, ``oversize_lines`` (lines above ``max_line_bytes``, dropped) and
    ``bad_utf8_lines`` (lines whose invalid UTF-8 was replaced).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        start_at_end: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        max_poll_bytes: int = 64 * 2**20,
    ) -> None:
        self.path = Path(path)
        self.start_at_end = start_at_end
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.max_poll_bytes = max_poll_bytes
        self.rotations = 0
        self.truncations = 0
        self.lines = 0
        self.bytes_read = 0
        self.bad_utf8_lines = 0
        self._splitter = _Splitter(max_line_bytes)
        self._fh: Any = None
        self._ident: tuple[int, int] | None = None
        self._pos = 0
        self._first_open = True
        self._events: list[Event] = []
        self._head = b""  # the file's first bytes, to notice a truncate-and-regrow between polls
        self._pipe = False  # a FIFO: read what is there, never wait, no size or head checks

    @property
    def oversize_lines(self) -> int:
        """Lines longer than ``max_line_bytes`` that were dropped."""
        return self._splitter.oversize

    @property
    def position(self) -> int:
        """Byte offset read so far in the current file."""
        return self._pos

    def drain_events(self) -> list[Event]:
        """The ``"truncated"`` events since the last call."""
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        """Close the open file, if any."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def poll(self) -> list[str]:
        """Complete lines appended since the last poll. Never raises on a missing file."""
        out: list[str] = []
        if self._fh is None and not self._open():
            return out
        try:
            size = os.fstat(self._fh.fileno()).st_size
        except OSError:
            size = self._pos
        if self._pipe:
            pass  # a pipe has no size and no start to return to
        elif size < self._pos:
            self._start_over("shrunk", f"{self.path} shrank from {self._pos} to {size} bytes")
        elif self._head and self._head_changed():
            self._start_over("rewritten", f"{self.path} was truncated and written again")
        if not self._read(out):
            return out  # poll budget used up: continue next time
        try:
            st = os.stat(self.path)
        except OSError:
            return out  # deleted (or being rotated): keep the old file until a new one appears
        if (st.st_dev, st.st_ino) == self._ident:
            return out
        # The path now names another file: the old one was renamed away or deleted.
        try:
            replaced = os.fstat(self._fh.fileno()).st_nlink == 0
        except OSError:
            replaced = True
        if replaced:
            self._splitter.reset()
        else:
            rest = self._splitter.take_partial()
            if rest is not None:
                self._emit(rest, out)
        self.close()
        if not self._open():
            return out
        if replaced:
            self.truncations += 1
            self._event("replaced", f"{self.path} was deleted and created again")
        else:
            self.rotations += 1
        self._read(out)
        return out

    # --- internals ------------------------------------------------------------------------------

    def _open(self) -> bool:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever (and block
        # the exporter's start and its SIGTERM); on a regular file the flag changes nothing.
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._first_open = False
            return False
        fh = os.fdopen(fd, "rb")  # noqa: SIM115 - kept open between polls
        st = os.fstat(fh.fileno())
        self._pipe = stat.S_ISFIFO(st.st_mode)
        self._fh = fh
        self._ident = (st.st_dev, st.st_ino)
        self._pos = 0
        self._head = b""
        self._splitter.reset()
        if self._first_open and self.start_at_end and st.st_size > 0 and not self._pipe:
            fh.seek(st.st_size - 1)
            last = fh.read(1)
            self._pos = st.st_size
            if last != b"\n":
                self._splitter.dropping = True  # the line in progress started before us
        self._first_open = False
        return True

    def _head_changed(self) -> bool:
        try:
            return os.pread(self._fh.fileno(), len(self._head), 0) != self._head
        except OSError:
            return False

    def _read(self, out: list[str]) -> bool:
        """Read up to the poll budget; True when the end of the file was reached."""
        try:
            return self._read_chunks(out)
        finally:
            if not self._head and self._pos >= HEAD_BYTES and not self._pipe:
                try:
                    self._head = os.pread(self._fh.fileno(), HEAD_BYTES, 0)
                except OSError:
                    self._head = b""

    def _read_chunks(self, out: list[str]) -> bool:
        budget = self.max_poll_bytes
        while budget > 0:
            try:
                chunk = self._fh.read(min(self.chunk_bytes, budget))
            except OSError:  # includes BlockingIOError: a FIFO with nothing to read now
                return True
            if not chunk:
                return True
            self._pos += len(chunk)
            self.bytes_read += len(chunk)
            budget -= len(chunk)
            for raw in self._splitter.feed(chunk):
                self._emit(raw, out)
        return False

    def _emit(self, raw: bytes, out: list[str]) -> None:
        out.append(_decode(raw, self))
        self.lines += 1

    def _start_over(self, reason: str, message: str) -> None:
        self.truncations += 1
        self._fh.seek(0)
        self._pos = 0
        self._head = b""
        self._splitter.reset()
        self._event(reason, message)

    def _event(self, reason: str, message: str) -> None:
        self._events.append(
            Event(
                "truncated", time.time(), None, message, {"path": str(self.path), "reason": reason}
            )
        )
