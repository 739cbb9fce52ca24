"""The stack dumps the exporter keeps (``<store>.stacks/``), written so no one can redirect them.

The exporter may run as root on a shared node, beside a store in a folder others can write
(``/tmp``). Every dump is written:

- into a folder this process created (mode 0700) or checked: a real directory (not a symbolic
  link), owned by this process's user, that no one else may write (a folder of ours with a
  looser mode is tightened to 0700; anyone else's is refused: nothing is written);
- through a descriptor of that folder (``dir_fd``): a folder swapped for a link after the check
  is not followed;
- with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600: a name planted in advance (a link to
  another file, a file) is never opened, it is an error in words and nothing is overwritten.

:meth:`StackFolder.trim` keeps the folder as the run store keeps its raw samples
(``RunStore``'s ``retention_s``: dumps older than that before the newest go) and under
``max_bytes`` (the oldest go first).
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds of dumps kept before the newest (the run store's default ``retention_s``).
RETENTION_S = 6 * 3600.0
#: Bytes of dumps kept at most (the oldest go first).
MAX_BYTES = 256 * 1024 * 1024
#: Seconds between two trims.
TRIM_EVERY_S = 300.0
_NAME = re.compile(r"^(?P<ts>\d+(?:\.\d+)?)_(?P<role>[A-Za-z_]+)_(?P<pid>\d+)\.txt$")
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeFolder(OSError):
    """The folder is not one this process may write into safely; the text says why."""


def dump_name(when: float, role: str, pid: int) -> str:
    """``<unix_ts>_<role>_<pid>.txt`` (the role's spaces as underscores), as
    ``analyze --stacks`` reads it."""
    safe = re.sub(r"[^A-Za-z_]", "_", role or "process") or "process"
    return f"{when:.3f}_{safe}_{int(pid)}.txt"


def open_private_dir(path: str | Path, uid: int | None = None) -> int:
    """A descriptor of ``path`` as a folder only ``uid`` (this process's) may write: created
    with mode 0700 when missing; refused (:class:`UnsafeFolder`) when it is a link, not a
    folder, or someone else's; tightened to 0700 when it is ours with a looser mode."""
    p = os.fspath(path)
    uid = os.geteuid() if uid is None else uid
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        if os.path.islink(p):
            raise UnsafeFolder(f"{p} is a symbolic link: not written through") from None
        raise UnsafeFolder(f"{p}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeFolder(f"{p} is not a folder")
        if st.st_uid != uid:
            raise UnsafeFolder(f"{p} belongs to uid {st.st_uid}, not to this exporter's "
                               f"(uid {uid}): not written into")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_new(dir_fd: int, name: str, text: str) -> None:
    """Create ``name`` in the folder ``dir_fd`` (mode 0600) and write ``text``; an existing
    name, a link among them, is an error (``FileExistsError``, ``OSError``): never followed,
    never overwritten."""
    if "/" in name or name in ("", ".", ".."):
        raise OSError(f"{name!r} is not a plain file name")
    fd = os.open(name, _FLAGS, 0o600, dir_fd=dir_fd)
    try:
        data = text.encode("utf-8", "replace")
        while data:
            n = os.write(fd, data)
            data = data[n:]
    finally:
        os.close(fd)


@dataclass
class StackFolder:
    """``<store>.stacks``: dumps written safely (see the module docstring), and trimmed."""

    path: Path
    retention_s: float = RETENTION_S
    max_bytes: int = MAX_BYTES
    _trimmed: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def save(self, when: float, role: str, pid: int, text: str) -> str:
        """Write one dump; returns its name. Raises OSError (:class:`UnsafeFolder` for the
        folder) in words; an existing name is left as it is."""
        with self._lock:
            fd = open_private_dir(self.path)
            try:
                name = dump_name(when, role, pid)
                try:
                    write_new(fd, name, text)
                except FileExistsError:
                    raise OSError(f"{self.path / name} exists already: not overwritten") \
                        from None
            finally:
                os.close(fd)
            if when - self._trimmed >= TRIM_EVERY_S:
                self._trimmed = when
                self._trim_locked()
            return name

    def trim(self) -> int:
        """Remove the dumps older than ``retention_s`` before the newest, then the oldest
        while the rest pass ``max_bytes``; returns how many went."""
        with self._lock:
            return self._trim_locked()

    def _trim_locked(self) -> int:
        try:
            fd = open_private_dir(self.path)
        except OSError:
            return 0
        removed = 0
        try:
            files = []
            for name in os.listdir(fd):
                m = _NAME.match(name)
                if not m:
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append((float(m.group("ts")), name, st.st_size))
            files.sort()
            newest = files[-1][0] if files else 0.0
            total = sum(f[2] for f in files)
            for ts, name, size in files:
                if ts >= newest - self.retention_s and total <= self.max_bytes:
                    continue
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    continue
                removed += 1
                total -= size
        finally:
            os.close(fd)
        return removed
