"""One writer per run store, whatever name the store is opened by.

Two exporters writing one store would double every row and fight over its node name; two
names of one file (a symlink, a hard link, a bind mount) must not get around that. The
exporter takes :class:`StoreLock` before it writes; a second one gets :class:`StoreLocked`,
one line that names the other process when it can. The lock is two kernel locks, both dropped
by the kernel when their holder dies (even on ``kill -9``), so a stale file never blocks a
restart:

- an ``flock`` on ``<real path>.lock``, the lock file next to the store's resolved path
  (symlinks resolved), holding the writer's pid for the message;
- an open-file-description lock (``F_OFD_SETLK``) on one byte of the store file itself, far
  past anything SQLite locks or writes (SQLite locks bytes from 1 GiB to 1 GiB + 512). It
  belongs to the file, not to a name, so a hard link to a store being written is refused too.
  SQLite's own locks cover other bytes, so readers (dashboards, ``analyze``, ``export``, which
  never take this lock) are not held up.

The store file is created (empty, which SQLite reads as a new database) when it is missing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

#: The byte the identity lock covers: 1 TiB, far past SQLite's lock bytes and any store size.
IDENTITY_BYTE = 2**40
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)  # Linux 3.15+; elsewhere only the lock file


class StoreLocked(RuntimeError):
    """Another live process holds the store's lock; one line naming it."""


def lock_path(store: str | os.PathLike[str]) -> Path:
    """The lock file of a store: ``<real path of the store>.lock``."""
    return Path(f"{os.path.realpath(os.fspath(store))}.lock")


def _identity_lock(fd: int, kind: int) -> None:
    """Set (``F_WRLCK``) or clear (``F_UNLCK``) the one-byte OFD lock; raises OSError."""
    if _OFD_SETLK is None:
        return
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padding
    fcntl.fcntl(fd, _OFD_SETLK, struct.pack("hhqqi4x", kind, os.SEEK_SET, IDENTITY_BYTE, 1, 0))


class StoreLock:
    """An exclusive, non-blocking lock on a store; ``acquire()`` then ``release()``."""

    def __init__(self, store: str | os.PathLike[str]) -> None:
        self.store = Path(store)
        self.path = lock_path(store)
        self._fd: int | None = None
        self._store_fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLocked` naming the holder's pid.

        Raises OSError when the lock file or the store cannot be opened (a read-only volume,
        a missing folder, a folder given as the store)."""
        real = os.path.realpath(self.store)
        if os.path.isdir(real):  # before leaving a lock file beside it
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), real)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreLocked(
                f"{self.store} is being written by another exporter (pid {holder}); stop it "
                "or give this one another --store") from None
        except OSError:
            os.close(fd)
            raise
        try:
            store_fd = os.open(real, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            _unlock_close(fd)
            raise
        try:
            _identity_lock(store_fd, fcntl.F_WRLCK)
        except OSError as exc:
            os.close(store_fd)
            _unlock_close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):  # held through another description
                raise StoreLocked(
                    f"{self.store} is another name (a hard link or mount) of a store that "
                    "another exporter is writing; stop it or give this one another --store"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd, self._store_fd = fd, store_fd

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file means nobody writes). Never raises:
        on a volume gone read-only the pid cannot be cleared, and closing still unlocks."""
        if self._store_fd is not None:
            os.close(self._store_fd)  # closing the description drops its OFD lock
            self._store_fd = None
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass  # read-only or gone: the flock below is what tells the next writer
            _unlock_close(self._fd)
            self._fd = None


def _unlock_close(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
