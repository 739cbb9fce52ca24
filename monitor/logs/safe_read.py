"""Files beside the log, read with the log's care.

The monitor reads more than the log: ``<log>.arrivals`` (capture times), ``<log>.exit`` (the
job's exit), the py-spy dumps of ``analyze --stacks`` and the log's own tail for the hang
watch. Anyone who can write beside the log can put anything at those names: a FIFO (an
``open`` or ``read`` that never returns), a link to ``/dev/zero`` (a read that never ends), a
link to a file elsewhere, a file of gigabytes. Every such read goes through this module:

- :func:`open_beside` opens without blocking (``O_NONBLOCK``), and only a regular file; a link
  is followed only when its target lies inside ``folder`` (``None``: links are followed, as the
  log itself is);
- :func:`read_capped` reads at most a given number of bytes, :func:`read_tail` the last ones;
- :func:`walk_files` walks a folder without recursion and never into a linked folder;
- :class:`Unreadable` says why a file was not read, in one line; :func:`note` says it once per
  file and reason (the exporter's log) and counts it per log (``count_for``).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class Unreadable(OSError):
    """A file beside the log that is not read; the message says why, in one line."""


def _inside(real: str, folder: str) -> bool:
    base = os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def open_beside(path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None
                ) -> BinaryIO:
    """``path`` opened for reading (binary), never blocking: only a regular file. With
    ``folder``, a link is followed only when its target lies inside that folder. Raises
    :class:`Unreadable` (missing, not regular, a link out of its folder, no permission)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, _FLAGS | (os.O_NOFOLLOW if folder is not None and
                                  not _link_inside(p, os.fspath(folder)) else 0))
    except FileNotFoundError:
        raise Unreadable(f"{p}: no such file") from None
    except OSError as exc:
        if folder is not None and os.path.islink(p):
            raise Unreadable(f"{p}: a symbolic link out of {folder}; not read") from None
        raise Unreadable(f"{p}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{p}: {_kind(st.st_mode)}, not a regular file; not read")
        if folder is not None and os.path.islink(p):
            real = os.path.realpath(p)
            if not _inside(real, os.fspath(folder)) or not _same(real, st):
                raise Unreadable(f"{p}: a symbolic link out of {folder}; not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _link_inside(path: str, folder: str) -> bool:
    """Whether ``path`` is a link whose target lies inside ``folder``."""
    return os.path.islink(path) and _inside(os.path.realpath(path), folder)


def _same(real: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(real)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def read_capped(path: str | os.PathLike[str], limit: int,
                folder: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of ``path`` (see :func:`open_beside`); a file over ``limit`` bytes is
    :class:`Unreadable` (it is not a file the monitor wrote), never read whole."""
    with open_beside(path, folder) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise Unreadable(f"{os.fspath(path)}: {size:,} bytes, over the {limit:,} read; "
                             "not read")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(f"{os.fspath(path)}: over the {limit:,} bytes read; not read")
    return data


def read_tail(path: str | os.PathLike[str], size: int,
              folder: str | os.PathLike[str] | None = None) -> bytes:
    """The last ``size`` bytes (at most) of the regular file ``path`` (see
    :func:`open_beside`)."""
    with open_beside(path, folder) as fh:
        end = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, end - size))
        return fh.read(size)


def walk_files(root: str | os.PathLike[str], wanted: Callable[[str], bool],
               max_depth: int = 32, max_entries: int = 100_000) -> Iterator[Path]:
    """The entries under ``root`` that are not folders and whose name ``wanted`` accepts
    (links and FIFOs included: reading them with :func:`open_beside` says what they are),
    walked without recursion (a folder nested thousands deep is no RecursionError), never
    into a linked folder, at most ``max_depth`` folders down and ``max_entries`` entries."""
    stack = [(os.fspath(root), 0)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for entry in entries:
            seen += 1
            if seen > max_entries:
                return
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if depth < max_depth:
                    subfolders.append((entry.path, depth + 1))
            elif wanted(entry.name):
                yield Path(entry.path)
        stack.extend(reversed(subfolders))


_lock = threading.Lock()
_said: set[tuple[str, str]] = set()
_counts: Counter[str] = Counter()


def note(problem: Unreadable | str, log_path: str | os.PathLike[str] | None = None) -> bool:
    """Say ``problem`` once (a warning in the exporter's log) and count it for ``log_path``
    (the log the file lies beside); True the first time this problem is seen. The same
    problem read again (the exit marker, every few seconds) is neither said nor counted
    again."""
    text = str(problem)
    key = (os.fspath(log_path) if log_path is not None else "", text)
    with _lock:
        if key in _said:
            return False
        if len(_said) > 10_000:  # bounded: a file renamed every second is still said
            _said.clear()
        _said.add(key)
        _counts[key[0]] += 1
    log.warning("%s", text)
    return True


def count_for(log_path: str | os.PathLike[str]) -> int:
    """How many distinct problems :func:`note` counted for the files beside ``log_path``."""
    with _lock:
        return _counts[os.fspath(log_path)]
