"""Files the monitor writes, created so that no one else can redirect them.

The exporter and ``verl-monitor run`` may run as root on a shared node, beside files in folders
others can write (``/tmp``). Every file they create goes through this module:

- :func:`open_private_dir`: a folder this process created (mode 0700) or checked: a real
  directory (not a symbolic link), owned by this process's user, that no one else may write (a
  folder of ours with a looser mode is tightened to 0700; anyone else's is refused);
- :func:`write_new`: a file created in such a folder through its descriptor, with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (mode 0600): a name planted in advance, a link among them,
  is never opened, it is an error and nothing is overwritten;
- :func:`create_new_file`: a file beside a file the user chose (the log's exit marker): the
  name is removed first (a link is removed, not followed), then created with ``O_EXCL |
  O_NOFOLLOW``: a name planted again in between makes it fail, never write elsewhere;
- :func:`open_append`: a file appended to across runs (the log's ``.arrivals`` sidecar,
  ``<log>.exporter.log``): opened with ``O_NOFOLLOW | O_NONBLOCK`` and kept only when it is a
  regular file (a link, a FIFO or a device at its name is refused).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


class UnsafeFolder(OSError):
    """The folder is not one this process may write into safely; the text says why."""


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
    fd = os.open(name, _NEW, 0o600, dir_fd=dir_fd)
    try:
        _write_all(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def create_new_file(path: str | Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` by a new file holding ``text``: the name is unlinked (a link itself,
    never what it points to), then created exclusively without following links; raises
    OSError (``FileExistsError`` when something was planted there in between)."""
    p = os.fspath(path)
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    fd = os.open(p, _NEW, mode)
    try:
        _write_all(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def open_append(path: str | Path, truncate: bool = False, mode: int = 0o644) -> int:
    """A descriptor to append to ``path`` (emptied first with ``truncate``), created when
    missing; refused (OSError) when the name is a link, a FIFO, a device or a folder."""
    p = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
    try:
        fd = os.open(p, flags, mode)
    except OSError as exc:
        if os.path.islink(p):
            raise OSError(exc.errno, f"{p} is a symbolic link: not written through") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{p} is not a regular file: not written")
        os.set_blocking(fd, True)
        if truncate:
            os.ftruncate(fd, 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]
