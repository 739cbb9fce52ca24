"""Ask local ranks for their Flight Recorder through their debug-info FIFOs.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<dir>/pipe_`` every rank creates the FIFO
``<dir>/pipe_<rank>.pipe`` and watches it from a thread of its own; a byte written to it makes
the rank write its Flight Recorder to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` even while its Python
thread is stuck (seen on an H200 with torch 2.11: the dump was whole 4.5-5.2 s after the
request). Writing never blocks here: a FIFO nobody reads (the rank is gone) answers ENXIO at
once, and that is reported for the rank, not waited on.
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
    asked_at = time.time()
    waiting: dict[int, Path] = {}
    for rank, pipe in sorted(pipes.items()):
        why = poke(pipe)
        if why:
            out.problems[rank] = why
        else:
            waiting[rank] = Path(f"{dump_base}{rank}")
    last_error: dict[int, str] = {}
    deadline = t0 + wait_s
    while waiting and time.monotonic() < deadline:
        for rank, path in list(waiting.items()):
            try:
                if path.stat().st_mtime < asked_at - 1.0:
                    continue
                out.dumps[rank] = read_dump(path, rank)
                del waiting[rank]
            except FileNotFoundError:
                continue
            except DumpError as exc:  # still being written, or not a dump
                last_error[rank] = str(exc)
        if waiting:
            time.sleep(poll_s)
    for rank in waiting:
        out.problems[rank] = (f"no whole dump within {wait_s:g} s"
                              + (f" ({last_error[rank]})" if rank in last_error else ""))
    out.seconds = time.monotonic() - t0
    return out
