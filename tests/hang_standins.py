"""Test scaffolding for the hang tests: real dumps, and stand-in ranks that answer a FIFO.

A stand-in rank is a real process that does what a torch rank does with
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: it creates ``<dir>/pipe_<rank>.pipe``, watches it, and
when a byte arrives writes its dump to ``<dir>/fr_<rank>`` (here: a dump given to it).
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "real_gpu" / "fr_1gpu"

STANDIN = r"""
import os, sys, time
directory, rank, dump_path, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
pipe = os.path.join(directory, f"pipe_{rank}.pipe")
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    try:
        data = os.read(fd, 16)
    except BlockingIOError:
        data = b""
    if data:
        time.sleep(delay)
        tmp = os.path.join(directory, f"fr_{rank}.tmp")
        with open(dump_path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp, os.path.join(directory, f"fr_{rank}"))
    time.sleep(0.02)
"""


def real_dump(name: str = "stuck_kernel") -> dict:
    """The recorded H200 dump ``name`` (running, stuck_kernel) as plain data."""
    with open(FIXTURES / name / "fr_0", "rb") as fh:
        return pickle.load(fh)


def as_rank(dump: dict, rank: int, world: int, drop_after: int | None = None) -> dict:
    """The real dump rewritten as rank ``rank`` of ``world``: entries after ``drop_after`` are
    removed (the rank never issued them) and the statuses follow."""
    d = copy.deepcopy(dump)
    for cfg in d["pg_config"].values():
        cfg["ranks"] = str(list(range(world)))
    if drop_after is not None:
        d["entries"] = [e for e in d["entries"] if e["collective_seq_id"] <= drop_after]
        for st in d["pg_status"].values():
            st["last_enqueued_collective"] = min(st["last_enqueued_collective"], drop_after)
            st["last_completed_collective"] = min(st["last_completed_collective"], drop_after)
    return d


def write_dump(path: Path, dump: dict) -> Path:
    """Pickle ``dump`` to ``path``."""
    path.write_bytes(pickle.dumps(dump))
    return path


def start_standin(directory: Path, rank: int, dump_path: Path, delay: float = 0.2
                  ) -> subprocess.Popen:
    """A process that answers ``pipe_<rank>.pipe`` by writing ``dump_path`` as ``fr_<rank>``."""
    p = subprocess.Popen([sys.executable, "-c", STANDIN, str(directory), str(rank),
                          str(dump_path), str(delay)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while not (directory / f"pipe_{rank}.pipe").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill the stand-ins."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout:
            p.stdout.close()


__all__ = ["FIXTURES", "as_rank", "real_dump", "start_standin", "stop", "write_dump", "os"]
