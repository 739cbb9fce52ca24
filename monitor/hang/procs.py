"""Which local process is which rank, and on which GPU: read from /proc, once per hang.

A rank holds its debug-info FIFO (``pipe_<rank>.pipe``) open for reading, and a CUDA process
holds ``/dev/nvidia<N>`` open for each GPU it uses, so one pass over ``/proc/<pid>/fd`` maps
ranks to PIDs and PIDs to GPUs (N is the device's minor number, which is NVML's index on
ordinary hosts). Processes we may not read are skipped; Linux only (elsewhere: empty maps).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from monitor.logs import safe_read

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


# ---------------------------------------------------------------------------- the job's processes
#: Ray's log prefix: ``(TaskRunner pid=123)``, ``(WorkerDict pid=45, ip=10.0.0.2)``.
RAY_PREFIX = re.compile(r"\((?P<cls>[A-Za-z_]\w*) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?"
                        r"\)")
#: How much of the end of each followed log is read for Ray's prefixes.
LOG_TAIL_BYTES = 1 << 20
#: Processes stacked at most per round.
MAX_PROCESSES = 32
#: A process running the monitor itself: the exporter, ``verl-monitor run``, ``python -m
#: monitor``, ``monitor.cli`` / ``cli.main`` (it holds a GPU through NVML, it is not the job's).
_MONITOR = re.compile(r"(?:^|[\s/])verl-monitor(?:\s|$)|\bmonitor\.cli\b|\bcli\.main\b"
                      r"|(?:^|\s)-m\s+monitor(?:\s|\.|$)")


def is_monitor(cmdline: str) -> bool:
    """True when a process's command line runs the monitor itself (never one of the job's)."""
    return bool(_MONITOR.search(cmdline))


@dataclass(frozen=True)
class JobProcess:
    """One local process of the job: its PID, role (driver, worker, ...) and how it was found
    (``log``: a Ray prefix in the log; ``title``: a Ray process title; ``tree``: a child of
    ``verl-monitor run``; ``gpu``: it holds a GPU)."""

    pid: int
    role: str
    source: str
    title: str = ""


def log_pids(text: str) -> dict[int, tuple[str, str]]:
    """PID -> (actor class, ip or '') of every Ray prefix in ``text`` (the last one wins)."""
    return {int(m.group("pid")): (m.group("cls"), m.group("ip") or "")
            for m in RAY_PREFIX.finditer(text)}


def read_tail(path: str | Path, size: int = LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of a file as text ('' when unreadable): a regular file only,
    opened without blocking (``monitor.logs.safe_read``: a FIFO or a link to a device gives
    '', as the log's follower says and counts)."""
    try:
        return safe_read.read_tail(path, size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def local_addresses() -> set[str]:
    """This host's IP addresses (loopback included)."""
    import psutil

    out = {"127.0.0.1", "::1"}
    try:
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%")[0] for a in addrs if a.address)
    except OSError:
        pass
    return out


def _title(pid: int) -> str | None:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except (psutil.Error, OSError):
        return None


def _ppid(pid: int) -> int | None:
    import psutil

    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, OSError):
        return None


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (none when it is gone or unreadable)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def _tree(parent: int | None) -> list[int]:
    """Descendants of ``parent`` when it is ``verl-monitor run`` (else none)."""
    import psutil

    if not parent:
        return []
    try:
        proc = psutil.Process(parent)
        cmd = " ".join(proc.cmdline())
        if "monitor" not in cmd or " run" not in cmd:
            return []
        return [c.pid for c in proc.children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def find_job_processes(logs: list[str] | tuple[str, ...] = (), parent: int | None = None,
                       gpu_pids: set[int] | None = None, limit: int = MAX_PROCESSES
                       ) -> list[JobProcess]:
    """The job's processes on this host, without configuration: Ray's log prefixes (local IPs
    only) and the children of ``verl-monitor run`` (``parent``), with the children of each
    (a driver's data loader workers and reward pools); when neither names one (a node
    without the log), every process with a Ray title of verl's actors; and the GPU holders.
    Drivers first; at most ``limit``. The monitor's own processes (this one, ``parent``, any
    ``verl-monitor`` / ``python -m monitor``) are never counted. Once the log or the run's tree
    has named the job, a GPU holder counts only when it is one of those or a sibling of a Ray
    process among them (the same raylet): another job's WorkerDicts and launchers on a shared
    node hold the GPU too. (Titles only as a fallback: another job has the same titles.)"""
    found: dict[int, JobProcess] = {}
    mine = {os.getpid(), parent or -1}
    _from_logs(found, mine, logs)
    _from_tree(found, mine, parent)
    for pid in list(found):  # their children: data loader workers, reward process pools
        for child in _children(pid):
            if _is_python(_title(child) or ""):
                _add(found, mine, child, "child", "child")
    known = dict(found)  # what the log and the run's tree named
    if not found:  # no log prefix, no wrapper: Ray's titles say which processes are a job's
        _from_titles(found, mine)
    raylets = {_ppid(p.pid) for p in known.values() if p.title.startswith("ray::")} - {None}
    for pid in sorted(gpu_pids or ()):
        if known and pid not in known and _ppid(pid) not in raylets:
            continue  # another job's (or a tool's): the job named its own processes
        _add(found, mine, pid, "gpu", "worker")
    order = {"driver": 0, "trainer": 1, "rollouter": 1}
    procs = sorted(found.values(), key=lambda p: (order.get(p.role, 2), p.pid))
    return procs[:limit]


def _is_python(title: str) -> bool:
    """A Ray worker or a Python process (py-spy reads Python only)."""
    return title.startswith("ray::") or os.path.basename(title.split(" ", 1)[0]).startswith(
        "python")


def _add(found: dict[int, JobProcess], mine: set[int], pid: int, source: str, fallback: str,
         title: str | None = None) -> None:
    """Count ``pid`` once, with its role from its title; never the monitor, never Ray's idle."""
    from monitor.hang.where import role_of

    if pid in found or pid in mine:
        return
    title = _title(pid) if title is None else title
    if title is None or is_monitor(title):
        return
    role, _ = role_of(title, fallback)
    if role == "idle":
        return
    found[pid] = JobProcess(pid, role or fallback, source, title)


def _from_logs(found: dict[int, JobProcess], mine: set[int], logs) -> None:
    from monitor.hang.where import ROLES

    here = local_addresses()
    for path in logs:
        for pid, (cls, ip) in log_pids(read_tail(path)).items():
            title = _title(pid) if not ip or ip in here else None
            if title and title.startswith("ray::"):  # a PID reused by another process is not
                _add(found, mine, pid, "log", ROLES.get(cls, cls), title)


def _from_tree(found: dict[int, JobProcess], mine: set[int], parent: int | None) -> None:
    """The run's children; the first of the job's is its driver unless the log named one."""
    has_driver = any(p.role == "driver" for p in found.values())
    for pid in _tree(parent):
        title = _title(pid) or ""
        if not _is_python(title) or is_monitor(title):
            continue
        _add(found, mine, pid, "tree", "child" if has_driver else "driver", title)
        has_driver = True


def _from_titles(found: dict[int, JobProcess], mine: set[int]) -> None:
    import psutil

    from monitor.hang.where import ROLES, role_of

    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if cmd.startswith("ray::") and role_of(cmd)[0] in set(ROLES.values()):
            _add(found, mine, proc.info["pid"], "title", "", cmd)


# ---------------------------------------------------------------------------- processes gone
def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed and not yet reaped, is gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


@dataclass(frozen=True)
class GoneProcess:
    """A process of the job seen alive that is gone: when it was last seen alive, and the
    GPU and rank it had then (None when unknown)."""

    proc: JobProcess
    last_alive: float
    gone_at: float
    gpu: int | None = None
    rank: int | None = None


#: Sources of processes that live as long as the job: a data loader's or reward pool's
#: children come and go by themselves (``persistent_workers=False``), their end is no news.
LASTING_SOURCES = frozenset(("log", "title", "tree", "gpu"))


@dataclass
class GoneWatch:
    """The job's lasting processes, looked at every poll: the ones that went away.

    :meth:`see` takes each fresh list of the job's processes (with their GPU and rank where
    known), :meth:`check` the liveness of those seen; both are given the time, so the class
    is pure but for the ``is_alive`` function it is built with."""

    is_alive: Callable[[int], bool] = alive
    seen: dict[int, tuple[JobProcess, float, int | None, int | None]] = field(
        default_factory=dict)
    gone: dict[int, GoneProcess] = field(default_factory=dict)
    keep_s: float = 3600.0

    def see(self, procs: list[JobProcess], now: float, gpus: dict[int, int] | None = None,
            ranks: dict[int, int] | None = None) -> None:
        """Remember the lasting ones of ``procs`` as alive at ``now``."""
        gpus, ranks = gpus or {}, ranks or {}
        for p in procs:
            if p.source not in LASTING_SOURCES:
                continue
            old = self.seen.get(p.pid)
            gpu = gpus.get(p.pid, old[2] if old else None)
            rank = ranks.get(p.pid, old[3] if old else None)
            self.seen[p.pid] = (p, now, gpu, rank)
            self.gone.pop(p.pid, None)  # back (a reused PID): alive again

    def check(self, now: float) -> list[GoneProcess]:
        """The processes seen that are no longer alive at ``now`` (newly gone ones)."""
        new = []
        for pid, (p, last, gpu, rank) in list(self.seen.items()):
            if self.is_alive(pid):
                self.seen[pid] = (p, now, gpu, rank)
                continue
            del self.seen[pid]
            g = GoneProcess(p, last, now, gpu, rank)
            self.gone[pid] = g
            new.append(g)
        for pid in [k for k, g in self.gone.items() if now - g.gone_at > self.keep_s]:
            del self.gone[pid]
        return new

    def gone_since(self, t: float) -> list[GoneProcess]:
        """The processes gone after ``t`` (alive at ``t`` or later), by when they went."""
        return sorted((g for g in self.gone.values() if g.last_alive >= t),
                      key=lambda g: (g.last_alive, g.proc.pid))
