"""Which local process is which rank, and on which GPU: read from /proc, once per hang.

A rank holds its debug-info FIFO (``pipe_<rank>.pipe``) open for reading, and a CUDA process
holds ``/dev/nvidia<N>`` open for each GPU it uses, so one pass over ``/proc/<pid>/fd`` maps
ranks to PIDs and PIDs to GPUs (N is the device's minor number, which is NVML's index on
ordinary hosts). Processes we may not read are skipped; Linux only (elsewhere: empty maps).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_NVIDIA = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass
class ProcessMap:
    """PIDs by FIFO path, and GPUs by PID."""

    fifo_pids: dict[str, int] = field(default_factory=dict)
    gpu_pids: dict[int, set[int]] = field(default_factory=dict)  # pid -> GPU minors

    def gpu_of(self, pid: int | None) -> int | None:
        """The lowest GPU the process has open (None when unknown)."""
        gpus = self.gpu_pids.get(pid or -1)
        return min(gpus) if gpus else None


def scan(fifos: list[Path] | None = None, proc: str = "/proc") -> ProcessMap:
    """One pass over ``proc``: who reads each FIFO of ``fifos``, and which GPUs each PID uses."""
    wanted = {os.path.realpath(p) for p in (fifos or [])}
    out = ProcessMap()
    me = os.getpid()
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid == me:
            continue
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            m = _NVIDIA.match(target)
            if m:
                out.gpu_pids.setdefault(pid, set()).add(int(m.group(1)))
            elif target in wanted:
                out.fifo_pids.setdefault(target, pid)
    return out
