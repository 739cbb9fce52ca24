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

from monitor.safe_write import UnsafeFolder, open_private_dir, write_new

__all__ = ["MAX_BYTES", "RETENTION_S", "StackFolder", "UnsafeFolder", "dump_name",
           "open_private_dir"]

#: Seconds of dumps kept before the newest (the run store's default ``retention_s``).
RETENTION_S = 6 * 3600.0
#: Bytes of dumps kept at most (the oldest go first).
MAX_BYTES = 256 * 1024 * 1024
#: Seconds between two trims.
TRIM_EVERY_S = 300.0
_NAME = re.compile(r"^(?P<ts>\d+(?:\.\d+)?)_(?P<role>[A-Za-z_]+)_(?P<pid>\d+)\.txt$")


def dump_name(when: float, role: str, pid: int) -> str:
    """``<unix_ts>_<role>_<pid>.txt`` (the role's spaces as underscores), as
    ``analyze --stacks`` reads it."""
    safe = re.sub(r"[^A-Za-z_]", "_", role or "process") or "process"
    return f"{when:.3f}_{safe}_{int(pid)}.txt"


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
