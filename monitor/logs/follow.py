"""Read log files as lines: whole files streamed (``iter_lines``) and live files followed with
``tail -F`` semantics (``LogFollower``).

Both read in chunks (never a whole file at once), decode UTF-8 with replacement (counting the
lines that needed it) and drop lines longer than ``max_line_bytes`` without holding them.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from monitor.records import Event

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 16 * 2**20
#: Bytes at the start of a followed file remembered to notice it was rewritten from scratch.
HEAD_BYTES = 64
#: Bytes at the start of a file hashed into a saved position's fingerprint (fewer when the
#: position is nearer the start): the same file is recognised after a restart or a rename.
FINGERPRINT_BYTES = 4096
#: Bytes just before a saved position hashed into it too (``tail_len``/``tail_fp``): a file
#: rewritten in place while nobody read it (same inode, same first bytes, as long or longer)
#: is told apart by what stands where the reading stopped.
TAIL_BYTES = 4096
#: Bytes before the read position compared on every poll: a rewrite between two polls that
#: kept the head is noticed there.
NEIGHBOUR_BYTES = 64


@dataclass(frozen=True)
class LogPosition:
    """Where a follower stands in one file: what a restart resumes from.

    ``dev``/``ino`` identify the file, ``offset`` is the end of the last line handed out,
    ``head_len``/``head_hash`` fingerprint its first bytes (a sha1 of ``head_len`` bytes):
    a file truncated and written again, or a copy of it, is told apart by them.
    ``saved_at``: when a store saved it (unix seconds; not part of equality).
    ``tail_len``/``tail_fp``: the ``tail_len`` bytes just before ``offset`` hashed into a
    52-bit number (0/0: not known, a position saved before they were)."""

    path: str
    dev: int
    ino: int
    offset: int
    head_len: int
    head_hash: str
    saved_at: float | None = field(default=None, compare=False)
    tail_len: int = 0
    tail_fp: int = 0


def tail_fingerprint(fd: int, offset: int, length: int) -> int | None:
    """The first 52 bits (an int a REAL column holds exactly) of the sha1 of the ``length``
    bytes before ``offset`` of an open file; None when they cannot all be read."""
    try:
        data = os.pread(fd, length, offset - length) if length else b""
    except OSError:
        return None
    if len(data) < length:
        return None
    return int(hashlib.sha1(data).hexdigest()[:13], 16)


def head_hash(fd: int, length: int) -> str | None:
    """sha1 (hex) of the first ``length`` bytes of an open file; None when it holds fewer."""
    try:
        data = os.pread(fd, length, 0) if length else b""
    except OSError:
        return None
    if len(data) < length:
        return None
    return hashlib.sha1(data).hexdigest()


class _Splitter:
    """Cuts a byte stream into lines; holds the partial last line; drops oversize lines."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.buf = bytearray()
        self.dropping = False
        self.oversize = 0
        #: the file offset just past each line the last ``feed`` returned
        self.ends: list[int] = []

    def feed(self, chunk: bytes, base: int = 0) -> list[bytes]:
        """Complete lines (without ``\\n``) that ``chunk`` (read at offset ``base``) finishes;
        ``ends`` then holds the offset just past each of them."""
        parts = chunk.split(b"\n")
        tail = parts.pop()
        ends = list(accumulate((len(p) + 1 for p in parts), initial=base))[1:]
        if parts:
            if self.dropping:
                del parts[0]
                del ends[0]
                self.dropping = False
            elif self.buf:
                self.buf += parts[0]
                parts[0] = bytes(self.buf)
            self.buf = bytearray()
            limit = self.max_line_bytes
            if len(chunk) > limit or (parts and len(parts[0]) > limit):
                kept = [i for i, p in enumerate(parts) if len(p) <= limit]
                self.oversize += len(parts) - len(kept)
                parts = [parts[i] for i in kept]
                ends = [ends[i] for i in kept]
        self.ends = ends
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
    for _, line in _lines(path, stats, max_line_bytes, chunk_bytes, False):
        yield line


def iter_lines_at(
    path: str | os.PathLike[str],
    *,
    stats: Any = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[tuple[int, str]]:
    """As :func:`iter_lines`, each line with the byte offset where it starts in the file."""
    return _lines(path, stats, max_line_bytes, chunk_bytes, True)


def _lines(path: str | os.PathLike[str], stats: Any, max_line_bytes: int, chunk_bytes: int,
           with_offsets: bool) -> Iterator[tuple[int, str]]:
    """``(offset, line)`` of each line (offset -1 unless ``with_offsets``); see
    :func:`iter_lines`."""
    pending: list[bytes] = []  # pieces of the line in progress
    pending_len = 0
    pending_at = 0  # where the line in progress starts
    dropping = False  # inside a line above max_line_bytes
    pos = 0  # where the chunk starts
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(chunk_bytes)
            if not chunk:
                break
            at, pos = pos, pos + len(chunk)
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
            head_at = pending_at
            if dropping:
                nl = head.find(b"\n")
                dropping = False
                if nl < 0:
                    pending, pending_len = [chunk[cut + 1 :]], len(chunk) - cut - 1
                    pending_at = at + cut + 1
                    continue
                head = head[nl + 1 :]
                head_at = at + nl + 1
            elif pending:
                pending.append(head)
                head = b"".join(pending)
            else:
                head_at = at
            pending, pending_len = [chunk[cut + 1 :]], len(chunk) - cut - 1
            pending_at = at + cut + 1
            yield from _split(head, head_at, stats, max_line_bytes, with_offsets)
    if not dropping and pending_len:
        yield pending_at if with_offsets else -1, _decode(b"".join(pending), stats)


def _split(head: bytes, head_at: int, stats: Any, max_line_bytes: int,
           with_offsets: bool) -> Iterator[tuple[int, str]]:
    """The complete lines of ``head`` (which starts at byte ``head_at``), decoded at once and
    split (the fast path), lines over ``max_line_bytes`` dropped and counted."""
    try:
        lines = head.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = [_decode(raw, stats) for raw in head.split(b"\n")]
    if with_offsets:
        starts = [head_at, *(head_at + n + 1 for n in _newlines(head))]
    else:
        starts = [-1] * len(lines)
    if len(head) > max_line_bytes:
        kept = [n for n, line in enumerate(lines)
                if len(line.encode("utf-8", "replace")) <= max_line_bytes]
        if stats is not None and hasattr(stats, "oversize_lines"):
            stats.oversize_lines += len(lines) - len(kept)
        lines, starts = [lines[n] for n in kept], [starts[n] for n in kept]
    for start, line in zip(starts, lines, strict=True):
        yield start, line[:-1] if line.endswith("\r") else line


def _newlines(data: bytes) -> Iterator[int]:
    """Where each ``\\n`` of ``data`` stands."""
    n = data.find(b"\n")
    while n >= 0:
        yield n
        n = data.find(b"\n", n + 1)


class LogFollower:
    """Follow a growing log file like ``tail -F``.

    ``poll()`` returns the complete lines written since the last poll (a partial last line is
    held until its newline arrives). It follows rename-rotation (finishing the old file first),
    starts over when the file shrinks (copy-truncate, verl's file logger truncating on resume),
    when its first 64 bytes change (truncated and regrown past our position between two polls)
    or when it is deleted and re-created, emitting a ``"truncated"`` event (``drain_events``),
    and waits quietly while the file is missing. A copy-truncated file whose copy (``name.1``,
    or any ``name.*`` / ``name-*`` sibling with the same first bytes) is found is finished from
    that copy first. Counters: ``lines``, ``bytes_read``, ``rotations``, ``truncations``,
    ``oversize_lines`` (lines above ``max_line_bytes``, dropped), ``bad_utf8_lines`` (lines
    whose invalid UTF-8 was replaced) and ``unrecovered`` (a saved position whose file is
    gone without a copy: lines written meanwhile could not be read).

    Restarts: ``position_at(i)`` / ``position()`` give a ``LogPosition`` to save with what was
    read; a follower given it back as ``resume_from`` continues exactly there: in the same file,
    or in the file it was renamed or copied to (then in the new one from its start).
    ``start_at_end`` applies only without a saved position.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        start_at_end: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        max_poll_bytes: int = 64 * 2**20,
        resume_from: LogPosition | None = None,
    ) -> None:
        self.path = Path(path)
        self.start_at_end = start_at_end
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.max_poll_bytes = max_poll_bytes
        self.rotations = 0
        self.truncations = 0
        #: the last poll stopped at ``max_poll_bytes``, before the end of the file
        self.behind = False
        self.lines = 0
        self.bytes_read = 0
        self.bad_utf8_lines = 0
        #: saved positions whose file was gone without a copy (lines meanwhile unread)
        self.unrecovered = 0
        #: saved positions whose file was rewritten in place meanwhile (same inode and first
        #: bytes, other bytes where the reading stopped): read again from the start
        self.rewritten = 0
        #: times the path named something that is not a regular file or a FIFO (a directory,
        #: a device such as /dev/urandom): not read, said once each time
        self.not_regular = 0
        #: one plain line for each unrecovered position, for the caller to log
        self.problems: list[str] = []
        self._splitter = _Splitter(max_line_bytes)
        self._fh: Any = None
        self._ident: tuple[int, int] | None = None
        self._pos = 0
        self._first_open = True
        self._saved = resume_from
        self._events: list[Event] = []
        self._head = b""  # the file's first bytes, to notice a truncate-and-regrow between polls
        self._pipe = False  # a FIFO: read what is there, never wait, no size or head checks
        self._ends: list[int] = []  # offset past each line of the current file in this poll
        self._first_current = 0  # index (in this poll's lines) of the current file's first line
        self._last_end = 0  # offset past the last complete line of the current file
        self._fp: tuple[int, str] | None = None  # (length, sha1) of the current file's head
        self._neighbour: tuple[int, bytes] | None = None  # bytes before the read position
        self._refused: tuple[int, int] | None = None  # the non-regular file last refused
        self._poll_start = 0  # where the current file's first line of this poll starts

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

    def saved_position(self) -> LogPosition | None:
        """Where the file stands after its last complete line (None: nothing open, a pipe)."""
        return self._position(self._last_end)

    def line_start(self, index: int) -> int | None:
        """The byte offset where line ``index`` of the last ``poll()``'s lines starts in the
        current file; None when that line came from a file rotated away during the poll."""
        i = index - self._first_current
        if i < 0 or i >= len(self._ends):
            return None
        return self._poll_start if i == 0 else self._ends[i - 1]

    def position_at(self, index: int) -> LogPosition | None:
        """The position just past line ``index`` of the last ``poll()``'s lines; None when
        that line came from a file rotated away during the poll."""
        i = index - self._first_current
        if i < 0 or i >= len(self._ends):
            return None
        return self._position(self._ends[i])

    def poll(self) -> list[str]:
        """Complete lines appended since the last poll. Never raises on a missing file."""
        out: list[str] = []
        self._ends = []
        self._first_current = 0
        if self._fh is None and not self._open():
            return out
        self._poll_start = self._last_end
        try:
            size = os.fstat(self._fh.fileno()).st_size
        except OSError:
            size = self._pos
        if self._pipe:
            pass  # a pipe has no size and no start to return to
        elif size < self._pos:
            if not self._switch_to_copy():
                self._start_over("shrunk", f"{self.path} shrank from {self._pos} to {size} bytes")
        elif (self._head and self._head_changed()) or self._neighbour_changed():
            if not self._switch_to_copy():
                self._start_over("rewritten", f"{self.path} was truncated and written again")
        self.behind = not self._read(out)
        if self.behind:
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
        self._first_current = len(out)
        self._ends = []
        if not self._open():
            return out
        if replaced:
            self.truncations += 1
            self._event("replaced", f"{self.path} was deleted and created again")
        else:
            self.rotations += 1
        self.behind = not self._read(out)
        return out

    # --- internals ------------------------------------------------------------------------------

    def _open(self) -> bool:
        if self._first_open and self._saved is not None:
            self._first_open = False
            if self._open_saved():
                return True
        at_end = self._first_open and self.start_at_end
        self._first_open = False
        return self._open_file(self.path, at_end=at_end)

    def _open_file(self, path: Path, *, at_end: bool = False, offset: int = 0) -> bool:
        opened = _open_nonblocking(path)
        if opened is None:
            return False
        fd, st = opened
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            os.close(fd)  # a directory or a device: never read (nor leak the descriptor)
            self._refuse(path, st)
            return False
        self._refused = None
        fh = os.fdopen(fd, "rb")  # noqa: SIM115 - kept open between polls
        self._pipe = stat.S_ISFIFO(st.st_mode)
        self._fh = fh
        self._ident = (st.st_dev, st.st_ino)
        self._pos = 0
        self._head = b""
        self._fp = None
        self._neighbour = None
        self._splitter.reset()
        if at_end and st.st_size > 0 and not self._pipe:
            offset = st.st_size
        if offset > 0 and not self._pipe:
            fh.seek(offset - 1)
            last = fh.read(1)
            self._pos = offset
            if last != b"\n":
                self._splitter.dropping = True  # the line in progress started before us
        self._last_end = self._poll_start = self._pos
        return True

    def _refuse(self, path: Path, st: os.stat_result) -> None:
        """Say once (per file met) that ``path`` is not a log file and is not read."""
        if self._refused == _ident(st):
            return
        self._refused = _ident(st)
        self.not_regular += 1
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        self.problems.append(f"{path} is {kind}, not a log file: not read (waiting for a "
                             "regular file at that path)")

    def _open_saved(self) -> bool:
        """Open the file a saved position belongs to, at its offset; False when it is gone."""
        saved, self._saved = self._saved, None
        if saved is None:
            return False
        ident = (saved.dev, saved.ino)
        current = _stat(self.path)
        if current is not None and _ident(current) == ident and _holds(self.path, saved):
            return self._open_file(self.path, offset=saved.offset)
        for cand in _siblings(self.path, ident):
            if _holds(cand, saved):
                return self._open_file(cand, offset=saved.offset)
        if current is not None and _holds(self.path, saved):  # the same bytes, another inode
            return self._open_file(self.path, offset=saved.offset)
        if current is not None and _ident(current) == ident and _holds(self.path, saved,
                                                                       tail=False):
            self.rewritten += 1
            message = (f"{self.path} was rewritten in place while it was not followed (the "
                       f"bytes before byte {saved.offset}, where the reading stopped, changed; "
                       f"its size and first bytes did not): reading {self.path} from its start")
            self.problems.append(message)
            self._event("rewritten", message)
            return False
        self.unrecovered += 1
        message = (f"{self.path}: the file read up to byte {saved.offset} before the restart was "
                   "rotated away or truncated and no copy of it was found; lines written to it "
                   f"after that byte are lost; reading {self.path} from its start")
        self.problems.append(message)
        self._event("lost", message)
        return False

    def _switch_to_copy(self) -> bool:
        """The file shrank or was rewritten: when a copy of what it held (copy-truncate's
        ``name.1``) is found, finish reading that copy from our offset first."""
        fp = self._fp
        if fp is None or self._pos <= 0:
            return False
        saved = LogPosition(str(self.path), 0, 0, self._pos, fp[0], fp[1])
        for cand in _siblings(self.path, None):
            st = _stat(cand)
            if st is None or _ident(st) == self._ident or not _holds(cand, saved):
                continue
            self.close()
            if self._open_file(cand, offset=saved.offset):
                return True
        return False

    def _position(self, offset: int) -> LogPosition | None:
        if self._fh is None or self._pipe or self._ident is None:
            return None
        length = min(offset, FINGERPRINT_BYTES)
        if self._fp is not None and self._fp[0] == length:
            digest: str | None = self._fp[1]
        else:
            digest = head_hash(self._fh.fileno(), length)
        if digest is None:
            return None
        tail_len = min(offset, TAIL_BYTES)
        tail_fp = tail_fingerprint(self._fh.fileno(), offset, tail_len)
        if tail_fp is None:
            return None
        return LogPosition(os.path.abspath(self.path), self._ident[0], self._ident[1], offset,
                           length, digest, tail_len=tail_len, tail_fp=tail_fp)

    def _neighbour_changed(self) -> bool:
        """True when the bytes before the last line read are no longer what they were."""
        if self._neighbour is None or self._pipe:
            return False
        end, data = self._neighbour
        try:
            return os.pread(self._fh.fileno(), len(data), end - len(data)) != data
        except OSError:
            return False

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
            if not self._pipe and self._fh is not None:
                if not self._head and self._pos >= HEAD_BYTES:
                    try:
                        self._head = os.pread(self._fh.fileno(), HEAD_BYTES, 0)
                    except OSError:
                        self._head = b""
                length = min(self._pos, FINGERPRINT_BYTES)
                if length and (self._fp is None or self._fp[0] < length):
                    digest = head_hash(self._fh.fileno(), length)
                    self._fp = None if digest is None else (length, digest)
                self._remember_neighbour()

    def _remember_neighbour(self) -> None:
        end = self._last_end
        if self._neighbour is not None and self._neighbour[0] == end:
            return
        length = min(end, NEIGHBOUR_BYTES)
        try:
            data = os.pread(self._fh.fileno(), length, end - length) if length else b""
        except OSError:
            data = b""
        self._neighbour = (end, data) if len(data) == length and length else None

    def _read_chunks(self, out: list[str]) -> bool:
        budget = self.max_poll_bytes
        while budget > 0:
            try:
                chunk = self._fh.read(min(self.chunk_bytes, budget))
            except OSError:  # includes BlockingIOError: a FIFO with nothing to read now
                return True
            if not chunk:
                return True
            base = self._pos
            self._pos += len(chunk)
            self.bytes_read += len(chunk)
            budget -= len(chunk)
            splitter = self._splitter
            for raw, end in zip(splitter.feed(chunk, base), splitter.ends, strict=True):
                self._emit(raw, out)
                self._ends.append(end)
                self._last_end = end
        return False

    def _emit(self, raw: bytes, out: list[str]) -> None:
        out.append(_decode(raw, self))
        self.lines += 1

    def _start_over(self, reason: str, message: str) -> None:
        self.truncations += 1
        self._fh.seek(0)
        self._pos = 0
        self._last_end = self._poll_start = 0
        self._head = b""
        self._fp = None
        self._neighbour = None
        self._splitter.reset()
        self._event(reason, message)

    def _event(self, reason: str, message: str) -> None:
        self._events.append(
            Event(
                "truncated", time.time(), None, message, {"path": str(self.path), "reason": reason}
            )
        )


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _open_nonblocking(path: Path) -> tuple[int, os.stat_result] | None:
    """A read-only descriptor of ``path`` and its stat, or None when it cannot be opened.

    O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever (and block the
    exporter's start and its SIGTERM); on a regular file the flag changes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return fd, os.fstat(fd)
    except OSError:
        os.close(fd)
        return None


def _holds(path: Path, saved: LogPosition, *, tail: bool = True) -> bool:
    """True when ``path`` is a regular file of at least ``saved.offset`` bytes whose first
    ``saved.head_len`` bytes hash to ``saved.head_hash`` and (``tail``, when the position
    knows them) whose ``saved.tail_len`` bytes before ``saved.offset`` match ``tail_fp``."""
    opened = _open_nonblocking(path)
    if opened is None:
        return False
    fd, st = opened
    try:
        if not stat.S_ISREG(st.st_mode) or st.st_size < saved.offset:
            return False
        if head_hash(fd, saved.head_len) != saved.head_hash:
            return False
        return (not tail or not saved.tail_len
                or tail_fingerprint(fd, saved.offset, saved.tail_len) == saved.tail_fp)
    finally:
        os.close(fd)


def _siblings(path: Path, ident: tuple[int, int] | None) -> list[Path]:
    """Files beside ``path`` that may hold its rotated content: the file with inode ``ident``
    (renamed), then ``name.1``, then other ``name.*`` / ``name-*`` files, newest first.
    Compressed ones (``.gz``, ``.zst``, ...) cannot be read and are left out."""
    folder = path.parent
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    base = path.name
    renamed: list[Path] = []
    others: list[tuple[float, Path]] = []
    for name in names:
        if name == base:
            continue
        cand = folder / name
        st = _stat(cand)
        if st is None or not stat.S_ISREG(st.st_mode):
            continue
        if ident is not None and _ident(st) == ident:
            renamed.append(cand)
        elif (name.startswith(base + ".") or name.startswith(base + "-")) and not name.endswith(
                (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")):
            first = name == base + ".1"
            others.append((float("inf") if first else st.st_mtime, cand))
    others.sort(key=lambda item: item[0], reverse=True)
    return renamed + [cand for _, cand in others]
