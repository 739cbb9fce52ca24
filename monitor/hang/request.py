"""Ask local ranks for their Flight Recorder through their debug-info FIFOs.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<dir>/pipe_`` every rank creates the FIFO
``<dir>/pipe_<rank>.pipe`` and watches it from a thread of its own; a byte written to it makes
the rank write its Flight Recorder to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` even while its Python
thread is stuck (seen on an H200 with torch 2.11: the dump was whole 4.5-5.2 s after the
request). Writing never blocks here: a FIFO nobody reads (the rank is gone) answers ENXIO at
once, and that is reported for the rank, not waited on. Reading never blocks either: a dump is
opened only as a regular file inside its directory (monitor/hang/dump.py). A dump that does not
load (truncated, garbage, nested too deep) fails its rank only: it is read again while it
changes, and at the end it is in ``problems`` and counted in ``bad``; the other ranks' dumps are
used.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from monitor.hang.dump import DumpError, RankDump, read_dump

#: How long to wait for the dumps after the request, seconds (the rank polls its FIFO).
DEFAULT_WAIT_S = 20.0


@dataclass
class DumpRound:
    """What one request round got: each rank's dump, and in words why the others are missing."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)  # rank -> why no dump
    seconds: float = 0.0
    note: str = ""  # a problem with the whole round (no directory, no FIFO)
    #: ranks whose dump came but could not be read (truncated, garbage, not a regular file)
    bad: dict[int, str] = field(default_factory=dict)

    @property
    def result(self) -> str:
        """``ok``, ``bad_dump`` (some dump came unreadable: those ranks failed, the others
        are used) or ``failed`` (no dump at all): the round's counter label."""
        if not self.dumps:
            return "failed"
        return "bad_dump" if self.bad else "ok"


def find_pipes(directory: str | Path, prefix: str = "pipe_") -> dict[int, Path]:
    """Rank -> FIFO path for every ``<prefix><rank>.pipe`` FIFO in ``directory``."""
    out: dict[int, Path] = {}
    pat = re.compile(re.escape(prefix) + r"(\d+)\.pipe$")
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        path = Path(directory) / name
        try:
            if stat.S_ISFIFO(path.stat().st_mode):
                out[int(m.group(1))] = path
        except OSError:
            continue
    return out


def poke(pipe: Path) -> str | None:
    """Write one byte to a rank's FIFO without blocking; None when written, else why not."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return "nobody reads its FIFO (the rank's process is gone or not watching)"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"no permission to write {pipe}"
        return f"cannot open {pipe}: {exc.strerror}"
    try:
        os.write(fd, b"1")
    except OSError as exc:
        return f"cannot write {pipe}: {exc.strerror}"
    finally:
        os.close(fd)
    return None


def _collect(out: DumpRound, waiting: dict[int, Path], asked_at: float, root: Path,
             deadline: float, poll_s: float) -> dict[int, str]:
    """Read each awaited dump once it is newer than the request, again only when it changes
    (size or time), until all came or the deadline; returns rank -> why the last read failed."""
    last_error: dict[int, str] = {}
    tried: dict[int, tuple[int, int]] = {}
    while waiting and time.monotonic() < deadline:
        for rank, path in list(waiting.items()):
            try:
                st = os.lstat(path)  # never follows a link, never opens a FIFO
            except FileNotFoundError:
                continue
            except OSError as exc:
                last_error[rank] = f"{path}: {exc.strerror or exc}"
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            if st.st_mtime < asked_at - 1.0 or tried.get(rank) == stamp:
                continue
            tried[rank] = stamp
            try:
                out.dumps[rank] = read_dump(path, rank, root=root)
                del waiting[rank]
                last_error.pop(rank, None)
            except DumpError as exc:  # still being written, or not a dump
                last_error[rank] = str(exc)
        if waiting:
            time.sleep(poll_s)
    return last_error


def request_dumps(directory: str | Path, pipe_prefix: str = "pipe_", dump_prefix: str = "fr_",
                  wait_s: float = DEFAULT_WAIT_S, poll_s: float = 0.05) -> DumpRound:
    """Ask every local rank for its dump and wait (at most ``wait_s``) for whole files.

    A dump counts only when it is newer than the request and loads whole; a rank whose FIFO
    cannot be written, or whose dump does not come in time, is in ``problems`` with the reason.
    ``dump_prefix`` may be a path prefix of its own (``/tmp/fr/fr_``); else it is in ``directory``.
    """
    t0 = time.monotonic()
    out = DumpRound()
    directory = Path(directory)
    if not directory.is_dir():
        out.note = f"{directory} is not a directory (set TORCH_NCCL_DEBUG_INFO_PIPE_FILE there)"
        return out
    pipes = find_pipes(directory, pipe_prefix)
    if not pipes:
        out.note = (f"no {pipe_prefix}<rank>.pipe FIFO in {directory}: the job does not set "
                    f"TORCH_NCCL_DEBUG_INFO_PIPE_FILE={directory}/{pipe_prefix}")
        return out
    dump_base = Path(dump_prefix) if os.sep in dump_prefix else directory / dump_prefix
    root = dump_base.parent  # a dump is read only inside its own directory
    asked_at = time.time()
    waiting: dict[int, Path] = {}
    for rank, pipe in sorted(pipes.items()):
        why = poke(pipe)
        if why:
            out.problems[rank] = why
        else:
            waiting[rank] = Path(f"{dump_base}{rank}")
    last_error = _collect(out, waiting, asked_at, root, t0 + wait_s, poll_s)
    for rank in waiting:
        out.problems[rank] = (f"no whole dump within {wait_s:g} s"
                              + (f" ({last_error[rank]})" if rank in last_error else ""))
        if rank in last_error:
            out.bad[rank] = last_error[rank]
    out.seconds = time.monotonic() - t0
    return out
