"""One writer per run store: an exclusive lock file next to it (``<store>.lock``).

Two exporters writing one store would double every row and fight over its node name. The
exporter takes :class:`StoreLock` before it writes; a second one gets :class:`StoreLocked`,
whose message names the other process. The lock is an ``flock`` on the lock file, so the
kernel drops it when its holder dies (even on ``kill -9``): a stale file never blocks a
restart. Readers (dashboards, ``analyze``, ``export``) never take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class StoreLocked(RuntimeError):
    """Another live process holds the store's lock; one line naming it."""


def lock_path(store: str | os.PathLike[str]) -> Path:
    """The lock file of a store: ``<store>.lock``."""
    return Path(f"{os.fspath(store)}.lock")


class StoreLock:
    """An exclusive, non-blocking lock on a store; ``acquire()`` then ``release()``."""

    def __init__(self, store: str | os.PathLike[str]) -> None:
        self.store = Path(store)
        self.path = lock_path(store)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLocked` naming the holder's pid."""
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file means nobody writes)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
